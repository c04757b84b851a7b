"""The shared device pool: leases with expiry, a priority wait queue and device health, on SQLite (one
host) or PostgreSQL (many hosts). See farm.pool.leases for the API, farm.pool.hold for holding a lease
(heartbeat, fence, release) and farm.config.PoolConfig for its settings."""

from farm.pool.leases import Lease, Pool
from farm.pool.model import (AVAILABLE, LEASED, OFFLINE, PRIORITIES, QUARANTINED, DeviceRecord,
                             DeviceState, DeviceStatus, Event, Holder, LeaseInfo, LeaseRequest,
                             PoolStatus, QueueEntry, SyncReport, parse_priority)

__all__ = ["AVAILABLE", "LEASED", "OFFLINE", "PRIORITIES", "QUARANTINED", "DeviceRecord",
           "DeviceState", "DeviceStatus", "Event", "Holder", "Lease", "LeaseInfo", "LeaseRequest", "Pool",
           "PoolStatus", "QueueEntry", "SyncReport", "parse_priority"]
