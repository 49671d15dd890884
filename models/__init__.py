"""Models: the chat/tool-call format, the in-process and SGLang engines, the DAPO trainer and its losses,
VCPO, LoRA adapters, the tiny model, SFT warm-up and SmolLM2 conversion.

A bottom layer: imports neither ``tasks`` nor ``sandbox``; its config slices live in the pydantic-only
``models.config``.
"""
