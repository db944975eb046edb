"""A benchmark whose numbers can be trusted: checked, timed, measured and traced.

`python -m attention.bench` (`attention/bench/__main__.py`) runs a profile (`profiles.py`): one or more
sweeps (`SWEEPS`, one file each under `sweeps/`, keeping the contract `sweeps.Sweep`) through one
measuring core (`core.py`: the envelope, `measure`, the failure path), and writes one JSON results file
(`results.py`: its schema, validator and migration) that records the machine, the versions, the commit,
the command line and a hash of the sources that ran. `render` gathers what the pages read.
docs/benchmark-schema.md describes the file.
"""

import importlib

from attention.bench.profiles import quick_config
from attention.bench.provenance import source_hash
from attention.bench.results import SCHEMA_VERSION

# name -> sweep module (`sweeps.Sweep`): a new sweep is a file under sweeps/ and its name here.
SWEEPS = {name: importlib.import_module(f"attention.bench.sweeps.{name}") for name in (
    "sequence",
    "block_sparse",
    "decode",
    "ring",
    "prefill",
    "bounds",
    "kernels",
    "linear",
    "sparse",
)}


def run_benchmark(config=None, implementations=None, progress=True, argv=None, checkpoint=None):
    """Run the sequence sweep alone and return the result dict (docs/benchmark-schema.md).

    `config`: a `sweeps.sequence.Config` (default: the default profile's); `implementations`: `{name: class}`
    to draw from (default the registry); `argv`: the command line to record (default `sys.argv`);
    `checkpoint`: a path rewritten after every row.
    """
    from attention.bench.core import Envelope

    config = config or SWEEPS["sequence"].Config()
    envelope = Envelope(config.profile, config.device, config.dtype, argv, checkpoint)
    envelope.progress = progress
    with envelope:
        SWEEPS["sequence"].run(config, envelope, implementations)
    return envelope.result


__all__ = ["SCHEMA_VERSION", "SWEEPS", "quick_config", "run_benchmark", "source_hash"]
