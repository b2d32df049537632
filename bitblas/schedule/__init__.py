"""Schedules: turn the TensorIR of a plan into a scheduled module, steered by a hint."""
from .cpu import CPUHint, schedule_cpu
from .cuda_simple import SimpleCUDAHint, schedule_cuda_simple

__all__ = ["CPUHint", "SimpleCUDAHint", "schedule_cpu", "schedule_cuda_simple", "schedule", "default_hint"]


def default_hint(plan):
    return CPUHint.default(plan) if plan.target_kind == "cpu" else SimpleCUDAHint.default(plan)


def schedule(func, plan, hint=None):
    """Scheduled IRModule of ``func`` (from ``emit_matmul(plan)``) for the plan's target kind."""
    hint = hint or default_hint(plan)
    if plan.target_kind == "cpu":
        return schedule_cpu(func, plan, hint)
    return schedule_cuda_simple(func, plan, hint)
