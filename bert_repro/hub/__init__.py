"""The hub stage, the last: pushes to the Hugging Face Hub (`push`) and model cards (`model_card`; docs/layout.md)."""
