"""Attention at inference (chapter 11): what the KV cache costs, and the tricks that shrink it.

Filled in as the chapter's pieces land (issue 12).
"""
