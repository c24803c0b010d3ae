"""KV offloading (paper Sec. 3.3): host-memory KV store + GPU mask / attention banks with LRU resolve."""

from infinitehip.kv.offload.bank import BankStats, KVBank
from infinitehip.kv.offload.host_store import HostKVStore
from infinitehip.kv.offload.offloaded import OffloadedKV
from infinitehip.kv.offload.resolve import invalidate, resolve

__all__ = ["BankStats", "HostKVStore", "KVBank", "OffloadedKV", "invalidate", "resolve"]
