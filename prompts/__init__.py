"""Prompt templates (verbatim from the papers where marked) and a tiny loader/renderer. Depends on nothing."""
