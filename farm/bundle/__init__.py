"""Bundles: the manifest (files, digests, modes, tokenizer, runner dialect) and its verification,
manifests for real QNN artifacts, the reference bundle exported from the small llama, and token counts
with a bundle's own tokenizer and chat template."""
