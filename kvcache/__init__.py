"""The KV cache and the attention backends. Knows nothing of models or of the app."""
from kvcache.attention import Attention, available_backends
from kvcache.cache import CacheOverflow, KVCache

__all__ = ["Attention", "CacheOverflow", "KVCache", "available_backends"]
