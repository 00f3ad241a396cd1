"""Stage 5, publishing: pushes to the Hugging Face Hub (`push`) and model cards (`model_card`; docs/layout.md)."""
