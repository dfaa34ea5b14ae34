"""GPU models by either of their names.

The agents report a GPU's model as NVML names it (`nvmlDeviceGetName()`, e.g. "NVIDIA A100-SXM4-80GB"):
that is the display name, `Gpu.model`, which the placement engine matches on. It holds spaces, so it
can never be a Kubernetes label value; KubeShare 2.0 writes models in `sharedgpu/gpu_model` with
the spaces as dashes ("NVIDIA-A100-SXM4-80GB"), and so does `Gpu.model_label`. Wherever a user
names a model (API, form, kubectl labels), either name is accepted and taken to the display name.
"""

from __future__ import annotations

from django.db.models import Max

from .models import Gpu


def label_name(model: str) -> str:
    """The label-safe name of a display name (what `Gpu.model_label` holds)."""
    return model.replace(" ", "-")


def fleet_models() -> dict[str, int]:
    """Known GPU models → the largest card's memory (MiB). (order_by(): Gpu's default ordering
    would join every card's node for nothing.)"""
    return dict(Gpu.objects.order_by().values_list("model").annotate(Max("memory_mib")))


def fleet_model_names() -> list[str]:
    """The GPU models the fleet has (one indexed DISTINCT; no memory read)."""
    return sorted(Gpu.objects.order_by().values_list("model", flat=True).distinct())


def known_models() -> dict[str, int]:
    """Every name a model can be called by (display and label-safe) → the largest card's memory (MiB)."""
    out: dict[str, int] = {}
    for model, memory in Gpu.objects.values_list("model").annotate(Max("memory_mib")):
        for name in (model, label_name(model)):
            out[name] = max(out.get(name, 0), memory)
    return out


def display_names(names: list[str]) -> list[str]:
    """Each name as the engine knows it: a display name stays, a label-safe name becomes the display
    name(s) it stands for, an unknown name stays as it is (validation names it)."""
    wanted = [n for n in names if n]
    if not wanted:
        return []
    by_label: dict[str, list[str]] = {}
    # A display name is confirmed by one index probe; only the other names (label-safe ones) are
    # looked for among the labels. order_by(): Gpu's default ordering (node name, index) would join
    # the nodes and make DISTINCT return every matching card (4,000 rows for a fleet of one model,
    # ~12 ms of CPU per submit naming a model) instead of each model once.
    models = {name for name in dict.fromkeys(wanted) if Gpu.objects.filter(model=name).exists()}
    others = [name for name in wanted if name not in models]
    if others:
        models |= set(Gpu.objects.filter(model_label__in=others).order_by().values_list("model", flat=True).distinct())
    for model in sorted(models):
        by_label.setdefault(label_name(model), []).append(model)
    out: list[str] = []
    for name in wanted:
        for model in ([name] if name in models else by_label.get(name, [name])):
            if model not in out:
                out.append(model)
    return out


def display_model(text: str) -> str:
    """A `gpu_model` value ("" for any, or names joined by '|') with each name as the engine knows it."""
    return "|".join(display_names(text.split("|"))) if text else text
