"""The MRTPO implementation object the checks test (a mutant replaces one function)."""

from engine.spec import registry
from methods.mrtpo.credit import beta_schedule, credit_weights, js_distance, mrtpo_advantages
from methods.mrtpo.mechanism import freeze, student_context

IMPL = registry.implementation(
    "mrtpo",
    js_distance=js_distance,
    beta_schedule=beta_schedule,
    credit_weights=credit_weights,
    mrtpo_advantages=mrtpo_advantages,
    student_context=student_context,
    freeze=freeze,
)
