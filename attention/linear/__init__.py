"""Linear attention: a fixed-size state per head in place of a cache of every past key and value.

One file per rule, each rule in its forms (`"recurrent"`, `"chunked"`, `"quadratic"`)
and a one-token decode step, every form the same function (tests/test_linear.py proves them equal in float64).
Each imports only torch and `checks.py` (the argument checks they share): a copy of this folder runs anywhere.

The ladder, each rung one change to the recurrence `S_t = decay * S_{t-1} + write`, `o_t = S_tᵀ q_t`:

* `retnet.py`: a fixed decay per head (RetNet, MiniMax's lightning attention);
* `mamba2.py`: a decay per head and position (Mamba-2's state-space duality);
* `gla.py`: a decay per key channel (gated linear attention);
* `delta.py`: no decay, and the write corrects what the state returns for the key (DeltaNet);
* `gated_delta.py`: the delta rule with a decay per head and position (gated DeltaNet; Qwen3-Next, Qwen3.5);
* `kimi_delta.py`: the delta rule with a decay per key channel (Kimi delta attention; Kimi Linear).
"""

from attention.linear.delta import delta_rule
from attention.linear.gated_delta import gated_delta_rule, gated_delta_step
from attention.linear.gla import gated_linear_attention, gated_linear_step
from attention.linear.kimi_delta import kimi_delta_rule, kimi_delta_step
from attention.linear.retnet import retention, retnet_log_decays
from attention.linear.mamba2 import ssd, ssd_step

__all__ = ["delta_rule", "gated_delta_rule", "gated_delta_step", "gated_linear_attention", "gated_linear_step",
           "kimi_delta_rule", "kimi_delta_step", "retention", "retnet_log_decays", "ssd", "ssd_step"]
