"""Shamir t-of-n sharing over GF(2^31-1): correctness, hiding threshold, errors, speed."""

import itertools
import os
import time

import numpy as np
import pytest

from protocols import shamir
from securefkm.exceptions import InputError


@pytest.mark.parametrize("t,n", [(1, 1), (2, 3), (3, 5), (7, 10)])
def test_any_t_shares_reconstruct(t, n):
    secret = os.urandom(32)
    shares = shamir.share(secret, t, range(1, n + 1))
    for subset in itertools.islice(itertools.combinations(shares, t), 20):
        assert shamir.reconstruct(list(subset), t) == secret


def test_odd_lengths_and_leading_zeros():
    for secret in [b"\x00" * 5 + b"\x01", b"\xff" * 33, b"x"]:
        shares = shamir.share(secret, 2, [5, 9, 11])
        assert shamir.reconstruct(shares[1:], 2) == secret


def test_fewer_than_t_shares_do_not_determine_secret():
    # with t-1 shares fixed, every candidate secret is consistent: check that two different
    # secrets can produce identical t-1 shares distributions -> here simply that the
    # (t-1)-subset reconstruction with threshold t-1 gives a wrong value
    secret = os.urandom(32)
    shares = shamir.share(secret, 3, range(1, 6))
    with pytest.raises(shamir.ShareError, match="too few"):
        shamir.reconstruct(shares[:2], 3)
    # interpolating 2 shares of a degree-2 polynomial yields garbage, not the secret
    try:
        wrong = shamir.reconstruct(shares[:2], 2)
    except shamir.ShareError:
        wrong = None
    assert wrong != secret


def test_per_holder_set_reconstruction_refuses_what_reconstruct_many_refuses():
    """The vectorised reconstruction of the sparse graph checks every share of every group
    at once: a wrong size, a non-bytes share, a duplicated point, too few shares and a
    limb out of range are refused as ShareError, like reconstruct_many; a tampered limb in
    range gives another secret or an out-of-range one (the masking layer's checks catch it)."""
    from protocols.masking.server import reconstruct_per_holder_set

    t = 3
    secrets = [os.urandom(32) for _ in range(4)]
    groups = [shamir.share(sec, t, [1 + g, 5 + g, 9 + g, 20 + g]) for g, sec in enumerate(secrets)]
    assert reconstruct_per_holder_set(groups, t) == secrets
    assert reconstruct_per_holder_set([[bytearray(sh) for sh in g] for g in groups], t) == secrets

    def broken(g, i, share):
        out = [list(gr) for gr in groups]
        out[g][i] = share
        return out

    for bad, match in (
        (broken(2, 3, groups[2][3][:-1]), "sizes differ"),  # a short share, not the group's first
        (broken(1, 2, groups[1][2] + b"\0\0\0\0"), "sizes differ"),
        (broken(3, 1, list(groups[3][1])), "sizes differ"),  # a list of ints, not bytes
        (broken(2, 1, groups[2][0]), "duplicate"),
        (broken(0, 1, groups[0][1][:6] + b"\xff\xff\xff\x7f" + groups[0][1][10:]), "out of range"),
        ([g[:2] if i == 1 else g for i, g in enumerate(groups)], "too few"),
    ):
        with pytest.raises(shamir.ShareError, match=match):
            reconstruct_per_holder_set(bad, t)
        with pytest.raises(shamir.ShareError):
            shamir.reconstruct_many(bad, t)
    tampered = bytearray(groups[1][0])
    tampered[8] ^= 0x01
    try:  # the shifted secret's limbs may fall out of range (refused) or not (another secret)
        got = reconstruct_per_holder_set(broken(1, 0, bytes(tampered)), t)[1]
    except shamir.ShareError:
        got = None
    assert got != secrets[1]


def test_duplicates_tampering_and_bad_arguments():
    secret = os.urandom(32)
    shares = shamir.share(secret, 3, [1, 2, 3, 4])
    with pytest.raises(shamir.ShareError, match="duplicate"):
        shamir.reconstruct([shares[0], shares[0], shares[1]], 3)
    tampered = bytearray(shares[1])
    tampered[8] ^= 0x40
    with pytest.raises(shamir.ShareError):
        # all limbs shifted by a random field element: out-of-range limbs are detected
        for _ in range(1):
            out = shamir.reconstruct([shares[0], bytes(tampered), shares[2]], 3)
            if out != secret:
                raise shamir.ShareError("mismatch")
    with pytest.raises(InputError, match="duplicates"):
        shamir.share(secret, 2, [1, 1, 2])
    with pytest.raises(InputError, match="x = 0"):
        shamir.share(secret, 2, [0, 1, 2])
    with pytest.raises(InputError, match="threshold"):
        shamir.share(secret, 5, [1, 2, 3])


def test_random_field_elements_uniform_range():
    v = shamir.random_field_elements((20000,))
    assert v.min() >= 0 and v.max() < shamir.P
    assert abs(v.mean() / shamir.P - 0.5) < 0.02


def test_mulmod_matmul_exact():
    rng = np.random.default_rng(0)
    a = rng.integers(0, shamir.P, (7, 300))
    b = rng.integers(0, shamir.P, (300, 5))
    exact = [[sum(int(x) * int(y) for x, y in zip(a[i], b[:, j])) % shamir.P for j in range(5)] for i in range(7)]
    assert np.array_equal(shamir.mulmod_matmul(a, b), np.array(exact))


def test_thousand_peers_in_milliseconds():
    xs = list(range(1, 1001))
    secrets = [os.urandom(32), os.urandom(32)]
    shamir.share_many(secrets, 667, xs)  # warm-up
    t0 = time.perf_counter()
    out = shamir.share_many(secrets, 667, xs)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"sharing two secrets among 1000 peers took {elapsed:.3f}s"
    assert shamir.reconstruct(out[1][300:967], 667) == secrets[1]


def _exact_matmul(a, b):
    return np.array([[sum(int(x) * int(y) for x, y in zip(a[i], b[:, j])) % shamir.P for j in range(b.shape[1])]
                     for i in range(a.shape[0])], dtype=np.int64).reshape(a.shape[0], b.shape[1])


@pytest.mark.parametrize("inner", [1, 2, 17, 63, 64, 65, 130])
def test_mulmod_matmul_paths_equal_python_ints(inner):
    """The one-product path (inner size <= SMALL_INNER) and the four-product path both give
    the exact product mod p, also at the extremes (every entry p - 1: the largest sums)."""
    rng = np.random.default_rng(inner)
    for a, b in [
        (rng.integers(0, shamir.P, (9, inner)), rng.integers(0, shamir.P, (inner, 11))),
        (np.full((3, inner), shamir.P - 1), np.full((inner, 4), shamir.P - 1)),
        (np.full((2, inner), shamir.P - 1), np.full((inner, 3), 2**31 - 2**16 - 1)),  # low half all ones
    ]:
        exact = _exact_matmul(a, b)
        assert np.array_equal(shamir.mulmod_matmul(a, b), exact)
        assert np.array_equal(shamir._matmul_split_both(a, b), exact)
        if inner <= shamir.SMALL_INNER:
            assert np.array_equal(shamir._matmul_split_b(a, b), exact)
    with pytest.raises(InputError):
        shamir._matmul_split_b(np.ones((1, shamir.SMALL_INNER + 1), dtype=np.int64),
                               np.ones((shamir.SMALL_INNER + 1, 1), dtype=np.int64))


def test_vandermonde_equals_python_powers():
    rng = np.random.default_rng(3)
    xs = np.concatenate([rng.integers(1, shamir.P, 20), [1, 2, shamir.P - 1, shamir.P - 2]]).astype(np.int64)
    for t in [1, 2, 3, 4, 5, 22, 26, 64, 65, 100]:
        expect = np.array([[pow(int(x), j, shamir.P) for j in range(t)] for x in xs], dtype=np.int64)
        assert np.array_equal(shamir.vandermonde(xs, t), expect), t


@pytest.mark.parametrize("t, holders", [(1, 3), (22, 43), (19, 37), (64, 80), (70, 100)])
def test_share_many_is_the_polynomial_evaluation_and_reconstructs_with_dropouts(monkeypatch, t, holders):
    """Every share is the coefficients' polynomial evaluated at its point (checked against
    Python integers with the coefficients share_many drew), and any t of them -- a random
    subset, as after dropouts -- give the secrets back, through both reconstructions."""
    from protocols.masking.server import reconstruct_per_holder_set

    rng = np.random.default_rng(t * 1000 + holders)
    xs = sorted(int(x) + 1 for x in rng.choice(50_000, holders, replace=False))
    xs[-1] = shamir.P - 1  # the largest point
    secrets = [os.urandom(32), os.urandom(32), b"\x00\x01", b"\xff" * 32]
    drawn = []
    real = shamir.random_field_elements

    def recording(shape):
        out = real(shape)
        out.flat[: out.size // 7] = shamir.P - 1  # extremes among the coefficients
        drawn.append(out.copy())
        return out

    monkeypatch.setattr(shamir, "random_field_elements", recording)
    out = shamir.share_many(secrets, t, xs)
    monkeypatch.undo()
    consts = np.array([v for s in secrets for v in shamir._limb_values(s)], dtype=np.int64)
    coeffs = np.vstack([consts[None, :]] + drawn) if drawn else consts[None, :]
    offset = 0
    for j, s in enumerate(secrets):
        m = shamir.n_limbs(len(s))
        for i, x in enumerate(xs):
            sx, length, ys = shamir.parse_share(out[j][i])
            assert (sx, length) == (x, len(s))
            expect = [sum(int(coeffs[d, offset + limb]) * pow(x, d, shamir.P) for d in range(t)) % shamir.P
                      for limb in range(m)]
            assert ys.tolist() == expect
        offset += m
    for _ in range(3):
        alive = sorted(rng.choice(holders, size=int(rng.integers(t, holders + 1)), replace=False).tolist())
        groups = [[out[j][i] for i in alive] for j in range(len(secrets))]
        assert shamir.reconstruct_many(groups, t) == secrets
        assert reconstruct_per_holder_set(groups, t) == secrets
    if t > 1:
        with pytest.raises(shamir.ShareError):
            shamir.reconstruct([out[0][i] for i in range(t - 1)], t)


def _share_many_with(monkeypatch, coeffs, secrets, t, xs):
    monkeypatch.setattr(shamir, "random_field_elements", lambda shape: coeffs.reshape(shape).copy())
    try:
        return shamir.share_many(secrets, t, xs)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("same_points", [False, True])
@pytest.mark.parametrize("t, m", [(1, 4), (2, 3), (22, 43), (65, 70), (66, 70)])
def test_share_rows_equal_share_many_with_the_same_coefficients(monkeypatch, same_points, t, m):
    """Many dealers shared at once (stacked products, or one Vandermonde matrix when all
    share their points; several chunks of rows) give byte for byte, holder by holder, the
    concatenated shares share_many makes from the same coefficients, at the points in
    ascending order; any t of them reconstruct the secrets."""
    rng = np.random.default_rng(t * 100 + m + same_points)
    n = 5
    base = rng.choice(30_000, m, replace=False) + 1
    rows = np.array([base if same_points else rng.choice(30_000, m, replace=False) + 1 for _ in range(n)])
    rows[:, 0] = shamir.P - 1
    width = 2 * shamir.n_limbs(32)
    secret_rows = [[os.urandom(32), os.urandom(32)] for _ in range(n)]
    drawn = []
    real = shamir.random_field_elements

    def recording(shape):
        out = real(shape)
        drawn.append(out.copy())
        return out

    monkeypatch.setattr(shamir, "random_field_elements", recording)
    got = shamir.share_rows(rows, t, secret_rows, chunk_elems=2 * m * max(t, 2 * width))  # several chunks
    monkeypatch.undo()
    if t > 1:  # the coefficients of dealer i, as share_many would draw them: (t - 1, width)
        if same_points:
            allc = np.concatenate(drawn, axis=1)  # (t - 1, n * width), dealer-major columns
            per_dealer = [allc[:, i * width : (i + 1) * width] for i in range(n)]
        else:
            per_dealer = list(np.concatenate(drawn, axis=0))
    for i, secrets in enumerate(secret_rows):
        pts = sorted(int(x) for x in rows[i])
        want = (shamir.share_many(secrets, t, pts) if t == 1 else
                _share_many_with(monkeypatch, per_dealer[i], secrets, t, pts))
        assert got[i] == [a + b for a, b in zip(*want)]
        size = len(want[0][0])
        picked = rng.choice(m, size=t, replace=False)
        groups = [[got[i][j][:size] for j in picked], [got[i][j][size:] for j in picked]]
        assert shamir.reconstruct_many(groups, t) == secrets


def test_share_rows_refuses_bad_points_and_secrets():
    two = [os.urandom(32), os.urandom(32)]
    for rows, t, secrets, match in [
        ([[1, 2, 2]], 2, [two], "duplicates"),
        ([[0, 2, 3]], 2, [two], "lie in"),
        ([[1, 2, 2**31]], 2, [two], "lie in"),
        ([[1, 2, 3]], 4, [two], "threshold"),
        ([[1, 2, 3]], 0, [two], "threshold"),
        ([1, 2, 3], 2, [two], "2-D"),
        ([[1, 2, 3], [4, 5, 6]], 2, [two], "one per dealer"),
        ([[1, 2, 3], [4, 5, 6]], 2, [two, [os.urandom(32)]], "as many secrets"),
        ([[1, 2, 3], [4, 5, 6]], 2, [two, [os.urandom(32), os.urandom(31)]], "same lengths"),
        ([[1, 2, 3]], 2, [[b""]], "1..65535 bytes"),
    ]:
        with pytest.raises(InputError, match=match):
            shamir.share_rows(rows, t, secrets)
