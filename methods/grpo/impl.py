"""The GRPO implementation bundle that checks receive (or a mutant of it); the control arm calls these too.

`control_loss` and `control_advantages` are the control arm's own entry points (methods/common/grpo.py, what every
paired mechanism run's GRPO arm trains with), bound here so specs/grpo.yaml checks the configuration the control
runs, not only the loss it delegates to: a slip in the wrapper (a seq-mean aggregation, a one-sided clip) fails
`contracts check grpo`, and through depends_on the gates of the methods compared against it.
"""

import functools

from engine.spec import registry
from methods.common import grpo as _control
from methods.grpo.loss import group_advantages, grpo_loss
from methods.grpo.sampler import behaviour_logprobs, response_mask


def _forward(name: str, target):
    """`target`'s signature, calling methods.common.grpo's `target.__name__` as it is at call time (so what the
    control arm runs is what is checked, a mutated or patched module included)."""
    attr = target.__name__

    @functools.wraps(target)
    def forward(*args, **kwargs):
        return getattr(_control, attr)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__module__ = __name__  # this package's module: `contracts mutate` plants in methods/common via __mutate_also__
    return forward


control_loss = _forward("control_loss", _control.grpo_token_loss)
control_advantages = _forward("control_advantages", _control.group_advantages)

IMPL = registry.implementation("grpo", group_advantages=group_advantages, grpo_loss=grpo_loss,
                               response_mask=response_mask, behaviour_logprobs=behaviour_logprobs,
                               control_loss=control_loss, control_advantages=control_advantages)
