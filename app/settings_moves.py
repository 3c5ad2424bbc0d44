"""Settings an older config may still name, so that it gets a clear error, not "unknown".

`app/settings.py` answers `section.field moved to <place>` for a field in MOVED_FIELDS
and `section.field was removed: <why>` for one in REMOVED_FIELDS, from a file, the
environment or `--set` alike.
"""

from __future__ import annotations

# Fields an older config may still name: where each is now (section.field) ...
MOVED_FIELDS: dict[tuple[str, str], str] = {
    # text segmentation is the text front end, not a talker decision
    ("talker", "first_fragment_words"): "text.first_fragment_words",
    ("talker", "max_segment_chars"): "text.max_segment_chars",
    ("talker", "max_segment_phonemes"): "text.max_segment_phonemes",
    ("talker", "first_segment_chars"): "text.first_segment_chars",
    # ONNX Runtime threads per session: a Piper runtime setting, not an engine decision
    ("talker", "intra_op_threads"): "piper.talker_intra_op_threads",
    ("vocoder", "intra_op_threads"): "piper.vocoder_intra_op_threads",
    # what the engine does for a stream alone: one section, one definition (pipeline/load.py)
    ("vocoder", "work_ahead_streams"): "alone.work_ahead (true or false)",
    ("talker", "prepare_ahead_streams"): "alone.prepare_next (true or false)",
    ("talker", "alone_urgent_slack_s"): "alone.urgent_slack_s",
    ("chunking", "even_tail"): "alone.even_tail",
}
# ... and those removed, with what to do instead
REMOVED_FIELDS: dict[tuple[str, str], str] = {
    ("chunking", "initial_chunk_frames"): "a ramp (chunking.ramp) sets the first chunks' sizes",
    ("piper", "solo_threads"): "solo sessions are gone (slower under load; docs/voice-tuning.md)",
    ("chunking", "solo_chunk_frames"): "solo chunks measured neutral (docs/voice-tuning.md)",
    ("chunking", "solo_slack_s"): "solo chunks measured neutral (docs/voice-tuning.md)",
    ("engine", "initial_capacity_audio_s_per_s"): (
        "the start-up calibration measures the capacity (engine.calibration_calls)"
    ),
    ("engine", "capacity_floor"): "the capacity model is the cap (docs/admission.md)",
    # the separate start queue became the one queue, its slots the start cost
    ("admission", "max_starting_streams"): "the start cost counts starts (admission.start_cost)",
    ("admission", "start_retry_after_s"): "Retry-After comes from the queue's prediction",
    ("admission", "start_queue_timeout_s"): "a request waits at most admission.queue_max_wait_s",
    ("admission", "fallback_retry_after_s"): "Retry-After comes from the queue's prediction",
    ("vocoder", "start_lane_chunks"): "the start lane measured worse with admission (removed)",
    ("vocoder", "work_ahead_while_talking"): "off by default and removed: alone.work_ahead",
    ("piper", "prepare_idle_priority"): "the helper thread runs at the process's priority",
}
