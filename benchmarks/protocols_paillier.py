"""Benchmark of the Paillier aggregator's packing (``python -m benchmarks protocols --part paillier``).

Measures, in one process on this machine, the client's encryption cost per encoded value:

* **unpacked**: phe's ``PaillierPublicKey.encrypt(v)`` of each 32-bit value on its own
  (one ``r^n mod n^2`` exponentiation per value);
* **packed**: :class:`protocols.paillier.SlotLayout` packing of 32-bit values with headroom
  for 1024 clients (42-bit slots), then one ``raw_encrypt`` per packed plaintext, divided
  by the number of values it carries (packing time included).

and prints the ratio packed / unpacked (target for 2048-bit keys: at most 1/45), plus the
authority's decryption and the server's homomorphic addition per ciphertext. The two
encryption paths are timed alternately, one operation each, in process CPU time, so load
from other processes on the machine affects both alike.
Also checks that the decrypted packed sum equals the plain sum.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

VALUE_BITS = 32
MAX_CLIENTS = 1024


def measure(key_size: int, pairs: int = 40, out=print) -> dict:
    """Time unpacked vs packed encryption per value for one key size; return the numbers.

    ``pairs`` times, one unpacked ``encrypt`` and one packed ciphertext (packing included)
    are timed back to back, in CPU time of this process (``time.process_time``), so other
    load on the machine affects both alike; the medians are compared.
    """
    import phe

    from protocols.paillier import homomorphic_sum, layout_for_key

    t0 = time.perf_counter()
    pk, sk = phe.generate_paillier_keypair(n_length=key_size)
    keygen = time.perf_counter() - t0
    lay = layout_for_key(pk.n, VALUE_BITS, MAX_CLIENTS)
    k = lay.slots_per_plaintext
    rng = np.random.default_rng(0)
    lo, hi = lay.value_range
    values = rng.integers(lo, hi + 1, size=(pairs, k))
    clock = time.process_time
    pk.encrypt(1), pk.raw_encrypt(lay.pack(values[0])[0])  # warm-up
    per_unpacked, per_packed = [], []
    for i in range(pairs):
        v = int(values[i, 0])
        t0 = clock()
        pk.encrypt(v)
        t1 = clock()
        (plaintext,) = lay.pack(values[i])
        pk.raw_encrypt(plaintext)
        t2 = clock()
        per_unpacked.append(t1 - t0)
        per_packed.append((t2 - t1) / k)
    u, p = statistics.median(per_unpacked), statistics.median(per_packed)

    # server addition and authority decryption per ciphertext; correctness of the packed sum
    n_clients, n_ct = 8, 8
    client_vals = [rng.integers(lo, hi + 1, size=k * n_ct) for _ in range(n_clients)]
    cts = [[pk.raw_encrypt(q) for q in lay.pack(v)] for v in client_vals]
    t0 = clock()
    total = homomorphic_sum(pk, cts)
    add = (clock() - t0) / ((n_clients - 1) * n_ct)
    t0 = clock()
    plain = [sk.raw_decrypt(c) for c in total]
    dec = (clock() - t0) / n_ct
    exact = lay.unpack(plain, k * n_ct, n_clients) == np.sum(client_vals, axis=0).tolist()
    res = {
        "key_size": key_size,
        "keygen_s": keygen,
        "slots": k,
        "slot_bits": lay.slot_bits,
        "unpacked_ms_per_value": u * 1e3,
        "packed_ms_per_value": p * 1e3,
        "ratio": p / u,
        "add_ms_per_ciphertext": add * 1e3,
        "decrypt_ms_per_ciphertext": dec * 1e3,
        "sum_exact": exact,
    }
    out(
        f"{key_size}-bit: keygen {keygen:.2f} s; {k} slots x {lay.slot_bits} bits "
        f"({VALUE_BITS} value + {lay.headroom} headroom for {MAX_CLIENTS} clients); "
        f"unpacked phe.encrypt {u * 1e3:.3f} ms/value; packed {p * 1e3:.4f} ms/value; "
        f"ratio packed/unpacked = 1/{1 / res['ratio']:.1f}; "
        f"server add {add * 1e3:.4f} ms/ciphertext; authority decrypt {dec * 1e3:.3f} ms/ciphertext; "
        f"decrypted packed sum exact: {exact}"
    )
    return res


def run(quick: bool = False, out=print) -> list[dict]:
    """Both key sizes; prints one line each and whether 2048-bit meets the 1/45 target."""
    import gmpy2
    import phe
    from phe import util

    out(f"phe {phe.__version__}, gmpy2 {gmpy2.version()} (used by phe: {util.HAVE_GMP})")
    results = [
        measure(2048, pairs=15 if quick else 60, out=out),
        measure(3072, pairs=8 if quick else 30, out=out),
    ]
    r = results[0]["ratio"]
    out(f"2048-bit target ratio <= 1/45: {'met' if r <= 1 / 45 else 'NOT met'} (1/{1 / r:.1f})")
    return results


if __name__ == "__main__":
    run()
