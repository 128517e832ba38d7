"""Moved to `rlfactory.trajectory` (the shared types live beside `rlfactory.config`, below every
package that names them). This re-export keeps old imports working."""

from rlfactory.trajectory import Role, Segment, Status, ToolCallRecord, Trajectory, read_jsonl, write_jsonl

__all__ = ["Role", "Segment", "Status", "ToolCallRecord", "Trajectory", "read_jsonl", "write_jsonl"]
