"""A user's model left as it was: what measuring in memory may touch, saved and put back.

:func:`unchanged` is the context of :func:`attngeom.extract.measurement.inmemory.measure`: on
leaving it (returned or raised) every module's training mode, every parameter's ``requires_grad``,
the attention implementation of every config a module reads, the hooks of every module and the
``attngeom`` entries of transformers' attention and mask registries are what they were on
entering. The discovery cache (:func:`attngeom.extract.measurement.archs.discover`) is kept on
purpose.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

from torch import nn

from .hooks import NAME, configs_of

# the per-module hook dicts of torch.nn.Module (those absent in a torch version are skipped)
HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
              "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
              "_forward_hooks_always_called", "_state_dict_hooks", "_state_dict_pre_hooks",
              "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
IMPL = "_attn_implementation_internal"       # the attribute behind config._attn_implementation
_ABSENT = object()


def _registries() -> tuple:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    return AttentionInterface, AttentionMaskInterface


@dataclass
class ModelState:
    """What :func:`unchanged` restores (see the module doc)."""

    training: list[tuple[nn.Module, bool]]
    requires_grad: list[tuple[nn.Parameter, bool]]
    impls: list[tuple[object, object]]
    hooks: list[tuple[dict, dict]]
    registered: list[tuple[type, object]]

    @classmethod
    def of(cls, model: nn.Module) -> "ModelState":
        modules = list(model.modules())
        return cls(
            training=[(m, m.training) for m in modules],
            requires_grad=[(p, p.requires_grad) for p in model.parameters()],
            impls=[(c, vars(c).get(IMPL, _ABSENT)) for c in configs_of(model)],
            hooks=[(d, dict(d)) for m in modules for name in HOOK_DICTS
                   if isinstance(d := getattr(m, name, None), dict)],
            registered=[(r, r._global_mapping.get(NAME, _ABSENT)) for r in _registries()])

    def restore(self) -> None:
        for module, mode in self.training:
            module.training = mode
        for param, flag in self.requires_grad:
            if param.requires_grad != flag:
                param.requires_grad_(flag)
        for config, impl in self.impls:               # set directly: no recursion into
            if impl is _ABSENT:                       # sub-configs, each has its own entry
                vars(config).pop(IMPL, None)
            else:
                vars(config)[IMPL] = impl
        for hooks, before in self.hooks:
            for key in [k for k in hooks if k not in before]:
                del hooks[key]
        for registry, entry in self.registered:
            if entry is _ABSENT:
                registry._global_mapping.pop(NAME, None)
            else:
                registry._global_mapping[NAME] = entry


@contextlib.contextmanager
def unchanged(model: nn.Module) -> Iterator[nn.Module]:
    """Run the block with ``model`` in eval mode; put back everything :class:`ModelState`
    holds when it ends, whether it returns or raises."""
    state = ModelState.of(model)
    try:
        model.eval()
        yield model
    finally:
        state.restore()
