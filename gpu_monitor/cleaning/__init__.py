"""The check between workloads (docs/cleaning.md): when the last GPU pod leaves the node, a
hold pod keeps new GPU work off it, the active suite runs, and a pass releases it.

``plan`` decides (pure); ``loop`` reads the node, acts and keeps the memory in the store.
"""
