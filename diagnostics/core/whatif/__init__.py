"""What-if: the predicted effect of a flag change, from the simulated engine replaying a window.

Three steps, each pure and each reporting how well it fits the window it came from:

1. :mod:`.workload`: the arrival process and the request shapes from the scrapes alone.
2. :mod:`.calibrate`: the engine's step time fitted to the window, and its KV block budget.
3. :mod:`.replay`: the window replayed on the simulated engine under a set of flags (:mod:`.flags`
   says which flags it models; any other is "not modelled", never guessed).

:func:`baseline` (:mod:`.predict`) runs the three once under the current flags; its
:meth:`~Baseline.predict` replays each change once :mod:`.gate` found that the baseline reproduces
the window on the metrics the finding is about. :mod:`.attach` puts the predictions on a
diagnosis's suggestions; :mod:`.words` says them in units a person reads.
"""

from diagnostics.core.whatif.attach import suggestion_changes, with_predictions
from diagnostics.core.whatif.calibrate import Calibration, StepCost, calibrate
from diagnostics.core.whatif.flags import MODELLED, Flags, NotModelled, apply
from diagnostics.core.whatif.gate import (
    AIMED,
    DEFAULT_AIM,
    REPRODUCTION,
    Check,
    Reproduction,
    aimed_for,
    bucket_of,
    check,
)
from diagnostics.core.whatif.predict import Baseline, Prediction, baseline
from diagnostics.core.whatif.ranges import RANGES, Estimate, Ranges, estimate
from diagnostics.core.whatif.replay import METRICS, Outcome, recorded, replay
from diagnostics.core.whatif.words import (
    HIGHER_IS_BETTER,
    LABELS,
    api_server_text,
    check_text,
    fmt_value,
    not_reproduced,
    summary,
)
from diagnostics.core.whatif.workload import InferredWorkload, LengthDist, infer_workload

__all__ = [
    "AIMED", "DEFAULT_AIM", "REPRODUCTION", "Check", "Reproduction", "aimed_for", "bucket_of", "check", "check_text",
    "not_reproduced", "api_server_text", "RANGES", "Estimate", "Ranges", "estimate",
    "HIGHER_IS_BETTER", "LABELS", "METRICS", "MODELLED", "Baseline", "Calibration", "Flags", "InferredWorkload",
    "LengthDist", "NotModelled", "Outcome", "Prediction", "StepCost", "apply", "baseline", "calibrate", "fmt_value",
    "infer_workload", "recorded", "replay", "suggestion_changes", "summary", "with_predictions",
]
