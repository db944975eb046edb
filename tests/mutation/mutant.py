"""One planted bug of the mutation run (tests/mutation/run.py): where it goes, what it stands for, what catches it."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mutant:
    """A plausible bug: `original` (exact text, found exactly once in `file`) replaced by `replacement`.

    Fields:
        name: short identifier, unique within its area file (`mutants_<area>.py`).
        file: the file it changes, from the repository root.
        original: the exact text it replaces; it must occur exactly once in `file`, so a stale entry
            (the code moved on) fails tests/mutation/test_mutation_run.py instead of mutating nothing.
        replacement: what the text becomes; the mutated file must still compile.
        why: the real mistake it stands for (a wrong softmax scale, a mask off by one...).
        tests: pytest arguments selecting the fast tests that should catch it, e.g.
            `"tests/test_masks.py"` or `"tests/test_implementations.py -k einsum"`.
        equivalent: empty for a real bug; otherwise why no test can tell the mutant from the real
            code (it then counts neither for nor against the score).
    """

    name: str
    file: str
    original: str
    replacement: str
    why: str
    tests: str
    equivalent: str = ""
