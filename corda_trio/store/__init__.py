"""Durable queues: a write-ahead log per queue with group commit, recovery and compaction, and the
local broker on top. Payloads are opaque bytes; this package imports nothing else from
``corda_trio`` but the small-file helpers of ``corda_trio.files``.

Typical use::

    async with store.open_broker(directory) as broker:
        queue = await broker.declare_queue("p2p.inbound.DLBz7a...")
        message_id = await queue.enqueue(payload)           # returns once durable
        async with queue.consumer(credit=64) as consumer:
            delivery = await consumer.receive()
            await consumer.ack(delivery.message_id)          # or consumer.release(...)

Checkpoints use a durable keyed log through the same group commit::

    log = await broker.open_keyed_log("checkpoints")
    await log.put(flow_id, checkpoint)                    # returns once durable
    await log.write([(a, x), (b, y)], [c])                # one atomic commit

The on-disk format is specified in ``protocol_spec/store-format.md``.
"""

from ._broker import Broker as Broker
from ._broker import BrokerConfig as BrokerConfig
from ._broker import Consumer as Consumer
from ._broker import Delivery as Delivery
from ._broker import FsyncPolicy as FsyncPolicy
from ._broker import Queue as Queue
from ._broker import QueueStatistics as QueueStatistics
from ._broker import open_broker as open_broker
from ._directory import KEYED_DIR as KEYED_DIR
from ._directory import LOCK_FILE as LOCK_FILE
from ._directory import list_keyed as list_keyed
from ._directory import list_root as list_root
from ._directory import lock_directory as lock_directory
from ._directory import store_kind as store_kind
from ._errors import BrokerLockedError as BrokerLockedError
from ._errors import CorruptSegmentError as CorruptSegmentError
from ._errors import InvalidQueueNameError as InvalidQueueNameError
from ._errors import MissingPartError as MissingPartError
from ._errors import NewerFormatError as NewerFormatError
from ._errors import PartListError as PartListError
from ._errors import QueueExistsError as QueueExistsError
from ._errors import QueueNotFoundError as QueueNotFoundError
from ._errors import StoreClosedError as StoreClosedError
from ._errors import StoreError as StoreError
from ._errors import StoreFailedError as StoreFailedError
from ._errors import UnknownDeliveryError as UnknownDeliveryError
from ._keyed import KeyedLog as KeyedLog
from ._keyed import KeyedLogStatistics as KeyedLogStatistics
from ._parts import MissingPart as MissingPart
from ._parts import PartList as PartList
from ._parts import check_parts as check_parts
from ._parts import check_store_format as check_store_format
from ._parts import find_missing_parts as find_missing_parts
from ._parts import read_part_list as read_part_list
from ._parts import write_part_list as write_part_list
from ._record import append_enqueue as append_enqueue
from ._record import unpack_location as unpack_location
from ._recovery import LostRecords as LostRecords
from ._recovery import RecoveryMode as RecoveryMode
from ._recovery import RecoveryReport as RecoveryReport
from ._recovery import RepairAction as RepairAction
from ._recovery import TornTail as TornTail
from ._recovery import recover_queue as recover_queue
from ._segment import PARTS_FILE as PARTS_FILE
from ._segment import QUARANTINE_DIR as QUARANTINE_DIR
from ._segment import check_queue_format as check_queue_format
from ._segment import validate_queue_name as validate_queue_name

__all__ = [
    "KEYED_DIR",
    "LOCK_FILE",
    "PARTS_FILE",
    "QUARANTINE_DIR",
    "Broker",
    "BrokerConfig",
    "BrokerLockedError",
    "Consumer",
    "CorruptSegmentError",
    "Delivery",
    "FsyncPolicy",
    "InvalidQueueNameError",
    "KeyedLog",
    "KeyedLogStatistics",
    "LostRecords",
    "MissingPart",
    "MissingPartError",
    "NewerFormatError",
    "PartList",
    "PartListError",
    "Queue",
    "QueueExistsError",
    "QueueNotFoundError",
    "QueueStatistics",
    "RecoveryMode",
    "RecoveryReport",
    "RepairAction",
    "StoreClosedError",
    "StoreError",
    "StoreFailedError",
    "TornTail",
    "UnknownDeliveryError",
    "append_enqueue",
    "check_parts",
    "check_queue_format",
    "check_store_format",
    "find_missing_parts",
    "list_keyed",
    "list_root",
    "lock_directory",
    "open_broker",
    "read_part_list",
    "recover_queue",
    "store_kind",
    "unpack_location",
    "validate_queue_name",
    "write_part_list",
]
