"""The runtime's cache is the library's one profile/frontier cache, ``perseus.store.cache``."""

from perseus.store.cache import CACHE_KEY_FIELD, DAG_MODEL_FIELD, FRONTIER_FILE, KEY_FILE, PROFILE_FILE, RunCache, key_hash

__all__ = ["CACHE_KEY_FIELD", "DAG_MODEL_FIELD", "FRONTIER_FILE", "KEY_FILE", "PROFILE_FILE", "RunCache", "key_hash"]
