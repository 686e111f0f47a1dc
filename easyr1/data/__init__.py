"""Prompt datasets in EasyR1's format (``dataset``, ``images``) and offline synthetic tasks (``synthetic``).

Nothing is re-exported here, so ``easyr1.data.synthetic`` imports without torch or ``datasets``.
"""
