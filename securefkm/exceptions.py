"""Exceptions raised by securefkm, protocols and attacks.

Every error that comes from bad input is a :class:`ValueError` subclass, so callers that
already catch ``ValueError`` keep working; its message names the argument and the fix.
"""


class SecureFKMError(Exception):
    """Base class of every error raised on purpose by the library.

    ``cli``: the same message with its fix in command-line syntax (``--param ...``,
    ``--protection ...``) for errors a ``securefkm`` command can hit; the CLI prints it
    instead of the Python wording (:meth:`for_cli`).
    """

    def __init__(self, *args, cli: str | None = None):
        super().__init__(*args)
        self.cli = cli

    def for_cli(self) -> str:
        return self.cli or str(self)


class InputError(SecureFKMError, ValueError):
    """Bad input: a wrong value, shape or combination of arguments."""


class EncodingError(InputError):
    """A client's own encoder refused its update: NaN or infinity, a fractional value in an
    integer field, a value above the codec's bound (:class:`protocols.codec.FixedPointCodec`).

    ``field``: the sum-field that failed; ``row``: when many clients were encoded at once
    (``encode_signed_many``), the index of the first failing client's update in that batch
    (the runtime maps it to the client and records that client's refusal)."""

    def __init__(self, message: str, *, field: str | None = None, row: int | None = None, cli: str | None = None):
        super().__init__(message, cli=cli)
        self.field = field
        self.row = row


class ProtectionConfigError(InputError):
    """The ``protection=[...]`` stack is inconsistent (order, duplicates, missing layers)."""


class RoundAbortedError(SecureFKMError, RuntimeError):
    """A round could not be completed (too few survivors, failed decoding, refused budget).

    The model state is left exactly as it was before the round and nothing partial is
    released. ``round`` is the round index and ``stage`` the protocol stage that failed.
    The federation retries such a round (``max_aborted_rounds``); see docs/aborted-rounds.md.

    ``cause`` (set by the runtime when it records the abort): ``"too_few_survivors"``,
    ``"refused_before_round"`` (a layer refused to start the round, e.g. GaussianDP's
    minimum participants) or ``"server_misbehaviour"``; ``released``: whether the server
    had learned something (a decoded sum, plain set-fields) before the round aborted, in
    which case the layers accounted for it (``Layer.after_aborted_round``).
    """

    def __init__(self, message: str, *, round: int | None = None, stage: str | None = None):
        super().__init__(message)
        self.round = round
        self.stage = stage
        self.cause: str | None = None
        self.released = False


class PrivacyBudgetExceededError(RoundAbortedError):
    """Running the next round would spend more privacy budget than the declared target."""


class NoParticipantsError(RoundAbortedError):
    """Every sampled client declined the round (e.g. all reached their participation cap)."""


class ServerMisbehaviourError(RoundAbortedError):
    """A protocol check caught the server sending inconsistent messages: the broadcast
    binding (masks that do not cancel because clients got different broadcasts), the
    consistency check, or honest clients refusing a malformed or malicious request.

    Unlike an abort caused by dropouts, this one ends the fit by default: continuing against a
    server caught cheating is the wrong default (``Federation(retry_server_misbehaviour=...)``).
    """


class TooManyAbortedRoundsError(RoundAbortedError):
    """More rounds of one run aborted than ``max_aborted_rounds`` allows.

    ``aborts`` lists the run's aborted rounds as
    :class:`~securefkm.transcript.AbortedRound` records (round, attempt, cause, stage, message).
    """

    def __init__(self, message: str, *, aborts=(), round: int | None = None, stage: str | None = None):
        super().__init__(message, round=round, stage=stage)
        self.aborts = tuple(aborts)
