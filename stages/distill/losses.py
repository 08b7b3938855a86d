"""Distillation losses: output matching by output kind, hidden-state matching, the task loss."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import OutputKind
from paretorch.stages.common.layer_outputs import tensor_leaves


@dataclass(frozen=True)
class LossWeights:
    """How much each term counts (a term whose weight is 0 is skipped)."""

    temperature: float = 2.0
    kd: float = 1.0
    cosine: float = 1.0
    mse: float = 1.0
    hidden: float = 1.0
    task: float = 0.0


def logits_loss(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """KL(teacher || student) of the softmax distributions at ``temperature``, times
    temperature^2 (so gradients keep their scale across temperatures), averaged per sample."""
    log_q = torch.log_softmax(student.float() / temperature, dim=-1)
    log_p = torch.log_softmax(teacher.float() / temperature, dim=-1)
    kl = nn.functional.kl_div(log_q.reshape(-1, log_q.shape[-1]), log_p.reshape(-1, log_p.shape[-1]),
                              reduction="batchmean", log_target=True)
    return kl * temperature**2


def embedding_loss(student: Tensor, teacher: Tensor, weights: LossWeights) -> Tensor:
    """``cosine * (1 - cos)`` per sample plus ``mse * MSE``, both averaged."""
    s = student.float().reshape(student.shape[0], -1)
    t = teacher.float().reshape(teacher.shape[0], -1)
    loss = torch.zeros((), device=s.device)
    if weights.cosine:
        loss = loss + weights.cosine * (1.0 - nn.functional.cosine_similarity(s, t, dim=1)).mean()
    if weights.mse:
        loss = loss + weights.mse * nn.functional.mse_loss(s, t)
    return loss


def output_loss(kind: OutputKind, student: Tensor, teacher: Tensor, weights: LossWeights) -> Tensor:
    """The output-matching term for ``kind``."""
    if student.shape != teacher.shape:
        raise InfeasibleConfig(f"distill: student output {tuple(student.shape)} and teacher output "
                               f"{tuple(teacher.shape)} differ in shape")
    if kind == "logits":
        return weights.kd * logits_loss(student, teacher, weights.temperature)
    return embedding_loss(student, teacher, weights)


def hidden_loss(student: Mapping[str, Tensor], teacher: Mapping[str, Tensor],
                layer_map: tuple[tuple[str, str], ...]) -> Tensor:
    """Mean of the MSEs between each mapped student layer's output and its teacher layer's."""
    terms = []
    for student_name, teacher_name in layer_map:
        s, t = student[student_name], teacher[teacher_name]
        if s.shape != t.shape:
            raise InfeasibleConfig(f"distill: layer_map {student_name}={teacher_name}: student output "
                                   f"{tuple(s.shape)} and teacher output {tuple(t.shape)} differ in shape "
                                   "(map layers whose outputs kept their width)")
        terms.append(nn.functional.mse_loss(s.float(), t.float()))
    return torch.stack(terms).mean()


def check_layer_names(model: nn.Module, names: list[str], role: str) -> dict[str, nn.Module]:
    """The modules named ``names``; :class:`InfeasibleConfig` naming any that ``model`` lacks."""
    modules = dict(model.named_modules())
    missing = [name for name in names if name not in modules]
    if missing:
        raise InfeasibleConfig(f"distill: layer_map names {role} layers the {role} does not have: "
                               f"{', '.join(missing)} (pruning may have removed them)")
    return {name: modules[name] for name in names}


@contextmanager
def captured_outputs(layers: Mapping[str, nn.Module]) -> Iterator[dict[str, Tensor]]:
    """While open, the dict maps each layer name to the first tensor its last call returned."""
    outputs: dict[str, Tensor] = {}

    def hook(name: str) -> Callable[[nn.Module, object, object], None]:
        def record(_module: nn.Module, _args: object, output: object) -> None:
            leaves = tensor_leaves(output)
            if leaves:
                outputs[name] = leaves[0]
        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in layers.items()]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()
