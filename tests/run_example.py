"""Run one example script as `__main__`, as `python examples/<name>.py` would, and count its figures.

    python tests/run_example.py examples/masks.py COUNTS.json

Every `matplotlib.figure.Figure` the script makes is counted (pyplot's figures are Figures too); the
count goes to COUNTS.json as `{"figures": N}`, also when the script fails. The built page of the
example must show exactly that many images: a figure that renders as text shows none.
"""

import json
import runpy
import sys

import matplotlib.figure


def main(script, counts_path):
    made = []
    original_init = matplotlib.figure.Figure.__init__

    def counting_init(self, *args, **kwargs):
        made.append(type(self).__name__)
        original_init(self, *args, **kwargs)

    matplotlib.figure.Figure.__init__ = counting_init
    sys.argv = [script]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        with open(counts_path, "w", encoding="utf-8") as file:
            json.dump({"figures": len(made)}, file)


if __name__ == "__main__":
    main(*sys.argv[1:])
