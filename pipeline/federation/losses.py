"""Per-row losses shared by the methods' client halves.

Every loss here returns one value per row (sample) so that an executor can sum each client's
rows and divide by that client's batch size, whether it runs one client or many in one step.
A teacher row of NaN means "no teacher for this sample": it is turned into a zero weight
(never into boolean indexing, which would change shapes between clients).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def teacher_weight(teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """teacher [n, C] with NaN rows -> (teacher with those rows zeroed, weight [n] of 1.0 / 0.0)."""
    has = ~torch.isnan(teacher[:, 0])
    return torch.where(has.unsqueeze(1), teacher, torch.zeros((), dtype=teacher.dtype, device=teacher.device)), \
        has.to(teacher.dtype)


def ce_rows(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y, reduction="none")


def kd_rows(student: torch.Tensor, teacher_logits: torch.Tensor, T: float) -> torch.Tensor:
    """T^2 * KL(softmax(teacher/T) || softmax(student/T)) per row; 0 where the teacher row is NaN."""
    teacher, weight = teacher_weight(teacher_logits)
    log_p_teacher = F.log_softmax(teacher / T, dim=1)
    kl = (log_p_teacher.exp() * (log_p_teacher - F.log_softmax(student / T, dim=1))).sum(dim=1)
    return kl * weight * (T * T)


def soft_kd_rows(student: torch.Tensor, teacher_probs: torch.Tensor, T: float) -> torch.Tensor:
    """T^2 * KL(teacher || softmax(student/T)) per row with teacher *probabilities*; 0 for NaN rows."""
    teacher, weight = teacher_weight(teacher_probs)
    kl = (torch.special.xlogy(teacher, teacher) - teacher * F.log_softmax(student / T, dim=1)).sum(dim=1)
    return kl * weight * (T * T)


def soft_ce_rows(student: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """CE(softmax(teacher), softmax(student)) per row (FD's distillation term); 0 for NaN rows."""
    teacher, weight = teacher_weight(teacher_logits)
    return -(F.softmax(teacher, dim=1) * F.log_softmax(student, dim=1)).sum(dim=1) * weight
