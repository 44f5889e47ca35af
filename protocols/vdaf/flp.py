"""The fully linear proof system of the VDAF draft (draft-irtf-cfrg-vdaf-20, Sec. 7.3).

Based on Boneh, Boyle, Corrigan-Gibbs, Gilboa, Ishai, "Zero-knowledge proofs on secret-shared
data via fully linear PCPs" (CRYPTO 2019), Sec. 4.2, with the draft's extensions (Sec. 7.3.1.1):
joint randomness, several gadget types, roots of unity as evaluation points and a random
linear reduction of a multi-output circuit.

* :class:`Valid` - the validity-circuit interface (Sec. 7.3.2) and its length helpers.
* Gadgets :class:`Mul`, :class:`PolyEval`, :class:`ParallelSum` (Appendix A).
* :class:`FlpBBCGGI19` - ``prove`` (Sec. 7.3.3), ``query`` (Sec. 7.3.4), ``decide``
  (Sec. 7.3.5), with the recording shims of Appendix A.4.

Polynomials are held in the Lagrange basis (values at powers of a root of unity).
"""
from __future__ import annotations

import copy

from .field import Lagrange, assert_power_of_2, next_power_of_2, poly_eval


def wire_poly_len(gadget_calls: int) -> int:
    return next_power_of_2(1 + gadget_calls)


def gadget_poly_len(gadget_degree: int, wire_polynomial_len: int) -> int:
    return gadget_degree * (wire_polynomial_len - 1) + 1


class Gadget:
    ARITY: int
    DEGREE: int

    def eval(self, field, inp: list[int]) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def eval_poly(self, field, inp_poly: list[list[int]]) -> list[int]:  # pragma: no cover
        raise NotImplementedError


class Mul(Gadget):
    """``Mul(x, y) = x * y`` (Appendix A.1)."""

    ARITY = 2
    DEGREE = 2

    def eval(self, field, inp):
        return inp[0] * inp[1] % field.MODULUS

    def eval_poly(self, field, inp_poly):
        return Lagrange(field).poly_mul(inp_poly[0], inp_poly[1])


class PolyEval(Gadget):
    """``p(x)`` for a public polynomial ``p`` (integer coefficients, ascending) (Appendix A.2)."""

    ARITY = 1

    def __init__(self, p: list[int], num_calls: int):
        p = list(p)
        while p and p[-1] == 0:
            p.pop()
        if not p:
            raise ValueError("PolyEval polynomial p must have a non-zero coefficient")
        self.p = p
        self.DEGREE = len(p) - 1
        self.n = next_power_of_2(gadget_poly_len(self.DEGREE, wire_poly_len(num_calls)))

    def eval(self, field, inp):
        return poly_eval(field, [c % field.MODULUS for c in self.p], inp[0])

    def eval_poly(self, field, inp_poly):
        m = len(inp_poly[0])
        assert_power_of_2(m)
        mono = field.inv_ntt(inp_poly[0], m)
        values = field.ntt(mono, self.n)
        coeffs = [c % field.MODULUS for c in self.p]
        return [poly_eval(field, coeffs, x) for x in values]


class ParallelSum(Gadget):
    """Sum of ``count`` calls of a subcircuit on consecutive input slices (Appendix A.3)."""

    def __init__(self, subcircuit: Gadget, count: int):
        if count < 1:
            raise ValueError(f"ParallelSum count must be >= 1, got {count}")
        self.subcircuit = subcircuit
        self.count = count
        self.ARITY = subcircuit.ARITY * count
        self.DEGREE = subcircuit.DEGREE

    def eval(self, field, inp):
        a = self.subcircuit.ARITY
        q = field.MODULUS
        if isinstance(self.subcircuit, Mul):  # fast path, same value
            return sum(inp[2 * i] * inp[2 * i + 1] for i in range(self.count)) % q
        out = 0
        for i in range(self.count):
            out += self.subcircuit.eval(field, inp[i * a:(i + 1) * a])
        return out % q

    def eval_poly(self, field, inp_poly):
        q = field.MODULUS
        length = next_power_of_2(gadget_poly_len(self.DEGREE, len(inp_poly[0])))
        a = self.subcircuit.ARITY
        if isinstance(self.subcircuit, Mul) and len(inp_poly[0]) > 1:
            # same values as summing Lagrange.poly_mul per pair, with batched transforms
            doubled = Lagrange(field).double_evaluations_rows(inp_poly)
            out = (doubled[0::2] * doubled[1::2]).sum(axis=0) % q
            return [int(x) for x in out]
        out = [0] * length
        for i in range(self.count):
            cur = self.subcircuit.eval_poly(field, inp_poly[i * a:(i + 1) * a])
            out = [(o + c) % q for o, c in zip(out, cur)]
        return out


class Valid:
    """Validity-circuit interface (Sec. 7.3.2).

    Subclasses set ``field``, ``GADGETS``, ``GADGET_CALLS``, ``MEAS_LEN``, ``JOINT_RAND_LEN``,
    ``EVAL_OUTPUT_LEN``, ``OUTPUT_LEN`` and implement ``encode``, ``eval``, ``truncate``,
    ``decode``. ``eval`` must call only ``self.GADGETS[i].eval`` for non-affine operations and
    scale constants by ``1/num_shares`` so that it is linear in the measurement shares.
    """

    field = None
    GADGETS: list[Gadget]
    GADGET_CALLS: list[int]
    MEAS_LEN: int
    JOINT_RAND_LEN: int
    EVAL_OUTPUT_LEN: int
    OUTPUT_LEN: int

    def prove_rand_len(self) -> int:
        return sum(g.ARITY for g in self.GADGETS)

    def query_rand_len(self) -> int:
        n = len(self.GADGETS)
        if self.EVAL_OUTPUT_LEN > 1:
            n += self.EVAL_OUTPUT_LEN
        return n

    def proof_len(self) -> int:
        return sum(g.ARITY + gadget_poly_len(g.DEGREE, wire_poly_len(c))
                   for g, c in zip(self.GADGETS, self.GADGET_CALLS))

    def verifier_len(self) -> int:
        return 1 + sum(g.ARITY + 1 for g in self.GADGETS)


class _ProveGadget(Gadget):
    """Records each call's input wires; the wire polynomial's first value is its seed (A.4)."""

    def __init__(self, field, wire_seeds, g: Gadget, g_calls: int):
        p = wire_poly_len(g_calls)
        self.inner = g
        self.ARITY, self.DEGREE = g.ARITY, g.DEGREE
        self.wires = []
        for s in wire_seeds:
            w = [0] * p
            w[0] = s
            self.wires.append(w)
        self.k = 0

    def eval(self, field, inp):
        self.k += 1
        for j, x in enumerate(inp):
            self.wires[j][self.k] = x
        return self.inner.eval(field, inp)

    def eval_poly(self, field, inp_poly):
        return self.inner.eval_poly(field, inp_poly)


class _QueryGadget(Gadget):
    """Records input wires and answers each call from the proof's gadget polynomial (A.4)."""

    def __init__(self, field, wire_seeds, gadget_poly, g: Gadget, g_calls: int):
        p = wire_poly_len(g_calls)
        self.ARITY, self.DEGREE = g.ARITY, g.DEGREE
        self.wires = []
        for s in wire_seeds:
            w = [0] * p
            w[0] = s
            self.wires.append(w)
        self.k = 0
        lag = Lagrange(field)
        poly = list(gadget_poly)
        lag.extend_values_to_power_of_2(poly, next_power_of_2(len(poly)))
        size = next_power_of_2(gadget_poly_len(g.DEGREE, p))
        while len(poly) < size:
            poly = lag.double_evaluations(poly)
        self.poly = poly
        self.step = 1 << (assert_power_of_2(size) - assert_power_of_2(p))

    def eval(self, field, inp):
        self.k += 1
        for j, x in enumerate(inp):
            self.wires[j][self.k] = x
        return self.poly[self.k * self.step]


def _wrapped(valid: Valid, gadgets: list[Gadget]) -> Valid:
    w = copy.copy(valid)
    w.GADGETS = gadgets
    return w


class FlpBBCGGI19:
    """The FLP of Sec. 7.3 over a validity circuit ``valid``."""

    def __init__(self, valid: Valid):
        self.valid = valid
        self.field = valid.field
        self.PROVE_RAND_LEN = valid.prove_rand_len()
        self.QUERY_RAND_LEN = valid.query_rand_len()
        self.JOINT_RAND_LEN = valid.JOINT_RAND_LEN
        self.MEAS_LEN = valid.MEAS_LEN
        self.OUTPUT_LEN = valid.OUTPUT_LEN
        self.PROOF_LEN = valid.proof_len()
        self.VERIFIER_LEN = valid.verifier_len()

    def encode(self, measurement) -> list[int]:
        return self.valid.encode(measurement)

    def truncate(self, meas):
        return self.valid.truncate(meas)

    def decode(self, output, num_measurements):
        return self.valid.decode(output, num_measurements)

    def prove(self, meas: list[int], prove_rand: list[int], joint_rand: list[int]) -> list[int]:
        """Sec. 7.3.3: wire seeds then the gadget polynomial's first values, per gadget."""
        F, v = self.field, self.valid
        gadgets, rest = [], list(prove_rand)
        for g, c in zip(v.GADGETS, v.GADGET_CALLS):
            seeds, rest = rest[:g.ARITY], rest[g.ARITY:]
            gadgets.append(_ProveGadget(F, seeds, g, c))
        _wrapped(v, gadgets).eval(meas, joint_rand, 1)
        proof: list[int] = []
        for g, c in zip(gadgets, v.GADGET_CALLS):
            p = wire_poly_len(c)
            proof += [w[0] for w in g.wires]
            gp = g.eval_poly(F, g.wires)
            proof += gp[:gadget_poly_len(g.DEGREE, p)]
        return proof

    def query(self, meas, proof, query_rand, joint_rand, num_shares: int) -> list[int]:
        """Sec. 7.3.4: (share of) the reduced circuit output and each gadget test."""
        F, v = self.field, self.valid
        q = F.MODULUS
        gadgets, rest = [], list(proof)
        for g, c in zip(v.GADGETS, v.GADGET_CALLS):
            glen = gadget_poly_len(g.DEGREE, wire_poly_len(c))
            seeds, rest = rest[:g.ARITY], rest[g.ARITY:]
            gp, rest = rest[:glen], rest[glen:]
            gadgets.append(_QueryGadget(F, seeds, gp, g, c))
        out = _wrapped(v, gadgets).eval(meas, joint_rand, num_shares)
        query_rand = list(query_rand)
        if v.EVAL_OUTPUT_LEN > 1:
            rand, query_rand = query_rand[:v.EVAL_OUTPUT_LEN], query_rand[v.EVAL_OUTPUT_LEN:]
            red = sum(r * o for r, o in zip(rand, out)) % q
        else:
            [red] = out
        lag = Lagrange(F)
        verifier = [red]
        for g, t in zip(gadgets, query_rand):
            p = len(g.wires[0])
            if pow(t, p, q) == 1:
                raise ValueError("test point is a root of unity")
            verifier += lag.poly_eval_batched(g.wires[:g.ARITY], t)
            verifier.append(lag.poly_eval(g.poly, t))
        return verifier

    def decide(self, verifier: list[int]) -> bool:
        """Sec. 7.3.5: the reduced output is zero and each gadget test holds."""
        if len(verifier) != self.VERIFIER_LEN:
            raise ValueError(f"verifier length {len(verifier)} != VERIFIER_LEN={self.VERIFIER_LEN}")
        if verifier[0] != 0:
            return False
        pos = 1
        for g in self.valid.GADGETS:
            wires = verifier[pos:pos + g.ARITY]
            check = verifier[pos + g.ARITY]
            pos += g.ARITY + 1
            if g.eval(self.field, wires) != check:
                return False
        return True
