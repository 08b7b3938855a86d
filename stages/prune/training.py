"""Gradient work around pruning: recovery fine-tuning and Taylor-importance gradients."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import LabelledBatch, ModelSpec, move_batch
from paretorch.stages.prune.model_checks import tensors_in

#: How many batches the Taylor importance accumulates gradients over.
TAYLOR_BATCHES = 4

TaylorLoss = Literal["task", "pseudo_label", "output_energy"]


def require_training(spec: ModelSpec, why: str) -> None:
    """:class:`InfeasibleConfig` saying ``why`` training data is needed, if the spec has none."""
    if spec.training is None or spec.loss is None:
        raise InfeasibleConfig(f"{why} needs training data, but spec '{spec.name}' has no training() and loss")


def training_data(spec: ModelSpec, why: str) -> Sequence[LabelledBatch]:
    """The spec's training batches; :class:`InfeasibleConfig` saying ``why`` they are needed if absent."""
    require_training(spec, why)
    batches = list(spec.training()) if spec.training is not None else []
    if not batches:
        raise InfeasibleConfig(f"{why} needs training data, but spec '{spec.name}' training() returned no batches")
    return batches


def recovery_finetune(model: nn.Module, spec: ModelSpec, device: torch.device, steps: int, lr: float) -> None:
    """``steps`` Adam steps over the spec's training batches (cycled) with its loss,
    on ``device``; leaves the model in eval mode. Divergence is infeasible."""
    if steps <= 0:
        return
    batches = training_data(spec, "recovery fine-tuning (finetune_steps > 0)")
    loss_fn = spec.loss
    if loss_fn is None:  # training_data checked it; this narrows the type
        raise InfeasibleConfig(f"spec '{spec.name}' has no loss")
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise InfeasibleConfig("recovery fine-tuning: every parameter of the model is frozen (requires_grad=False)")
    optimizer = torch.optim.Adam(parameters, lr=lr)
    model.train()
    loss = torch.zeros(())
    for (inputs, targets), _ in zip(itertools.cycle(batches), range(steps), strict=False):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(*move_batch(inputs, device)), targets.to(device))
        loss.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    if not bool(torch.isfinite(loss.detach())):
        raise InfeasibleConfig(f"recovery fine-tuning diverged: loss is {float(loss)} after {steps} steps at lr={lr}")


def taylor_gradients(model: nn.Module, spec: ModelSpec, device: torch.device, calibration: Sequence) -> TaylorLoss:
    """Fill ``.grad`` of every parameter for first-order Taylor importance (|w * dL/dw|).

    The loss, in order of preference:

    * ``task``: the spec's own ``loss`` on up to :data:`TAYLOR_BATCHES` training batches;
    * ``pseudo_label``: without training data, cross-entropy of the model's 2-D
      outputs (taken as class logits) against its own argmax predictions, on the
      calibration batches. (Self-distillation against an unpruned copy would give
      zero gradients: the copy is identical before pruning.)
    * ``output_energy``: for other outputs, the mean squared output, so a
      channel's score is its first-order contribution to the output's magnitude.

    The model stays in eval mode (BatchNorm statistics untouched). Returns which loss was used.
    """
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(True)
        p.grad = None
    model.eval()
    kind: TaylorLoss
    try:
        if spec.training is not None and spec.loss is not None:
            kind = "task"
            for inputs, targets in list(spec.training())[:TAYLOR_BATCHES]:
                spec.loss(model(*move_batch(inputs, device)), targets.to(device)).backward()
        else:
            batches = list(calibration)[:TAYLOR_BATCHES]
            if not batches:
                raise InfeasibleConfig(f"taylor importance needs calibration batches; spec '{spec.name}' has none")
            kind = "pseudo_label"
            for inputs in batches:
                loss, kind = _self_supervised_loss(model(*inputs))
                loss.backward()
    finally:
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)
    return kind


def _self_supervised_loss(output: object) -> tuple[Tensor, TaylorLoss]:
    if isinstance(output, Tensor) and output.dim() == 2 and output.shape[1] > 1:
        return nn.functional.cross_entropy(output, output.detach().argmax(dim=1)), "pseudo_label"
    tensors = [output] if isinstance(output, Tensor) else [t for t in tensors_in(output) if t.is_floating_point()]
    if not tensors:
        raise InfeasibleConfig("taylor importance: the model output has no floating tensor to take gradients of")
    return sum((t.float().pow(2).mean() for t in tensors), torch.zeros((), device=tensors[0].device)), "output_energy"


def clear_gradients(model: nn.Module) -> None:
    """Drop every ``.grad`` (pruned parameters must not carry stale gradients)."""
    for p in model.parameters():
        p.grad = None


def split_steps(total: int, parts: int) -> list[int]:
    """``total`` fine-tuning steps spread over ``parts`` pruning steps (the remainder goes last)."""
    base, remainder = divmod(total, parts)
    return [base + (1 if i >= parts - remainder else 0) for i in range(parts)]
