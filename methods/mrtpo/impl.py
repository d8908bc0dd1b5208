"""The MRTPO implementation object the checks test (a mutant replaces one function).

Besides the formulas it holds the mechanism's method-specific harness steps
(the context builder, the warm-up counter, the frozen replay), so a candidate
or a mutant can replace them and the contracts judge them like the rest.
"""

from engine.spec import registry
from methods.mrtpo.credit import (
    beta_schedule,
    credit_weights,
    credit_weights_from_logits,
    js_distance,
    mrtpo_advantages,
)
from methods.mrtpo.mechanism import freeze, replay_contexts, student_context, warmup_step

IMPL = registry.implementation(
    "mrtpo",
    js_distance=js_distance,
    beta_schedule=beta_schedule,
    credit_weights=credit_weights,
    credit_weights_from_logits=credit_weights_from_logits,
    mrtpo_advantages=mrtpo_advantages,
    student_context=student_context,
    freeze=freeze,
    replay_contexts=replay_contexts,
    warmup_step=warmup_step,
)
