"""Meta-device analysis of a model into per-layer costs."""

from unipar.analysis.profile import LayerKind, LayerProfile, ModelProfile, analyze, layer_sequence

__all__ = ["LayerKind", "LayerProfile", "ModelProfile", "analyze", "layer_sequence"]
