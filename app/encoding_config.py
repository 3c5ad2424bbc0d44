"""The `encoding` section of the settings: what app/audio.py's encoders are built with.

Its own module (not app/audio.py) so that loading the settings does not import PyAV and
soxr. The bit-rate ranges are what each encoder accepts for mono (see the constants);
outside them libopus refuses to open and LAME would silently clamp.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.validation import check_choice, check_int_in, check_number_in

# LAME: MPEG-1 Layer III tops out at 320 kb/s; at 16..24 kHz (MPEG-2) it clamps to 160 kb/s,
# at 8..12 kHz (MPEG-2.5) to 64 kb/s.
MP3_BITRATE_RANGE_BPS = (8_000, 320_000)
# libopus through ffmpeg: 256 kb/s per channel at most; below 6 kb/s it clamps to 6 kb/s.
OPUS_BITRATE_RANGE_BPS = (6_000, 256_000)
# ffmpeg's aac: it clamps to 6144 bits per frame per channel (144 kb/s at 24 kHz).
AAC_BITRATE_RANGE_BPS = (8_000, 512_000)
# Ogg page duration: one 20 ms Opus packet per page at 20 ms; libavformat's default is 1 s.
OGG_PAGE_RANGE_MS = (5, 1000)
# soxr's quality recipes, quick to very high (HQ: 20-bit precision, plenty for 16-bit output).
RESAMPLE_QUALITIES = ("QQ", "LQ", "MQ", "HQ", "VHQ")
# 1 s of audio takes ~10-14 ms to encode as mp3: more than that on the event loop stalls it.
MAX_INLINE_ENCODE_S = 1.0
MAX_ENCODER_THREADS = 64


@dataclass(frozen=True)
class EncodingConfig:
    mp3_bitrate_bps: int = 64_000  # libmp3lame constant bit rate
    opus_bitrate_bps: int = 32_000  # libopus target bit rate
    aac_bitrate_bps: int = 64_000  # ffmpeg aac target bit rate
    # Ogg page duration of opus: a page leaves once the next one starts. 20 ms pages (one
    # Opus packet each; less changes nothing) cost a third more bytes than 1 s pages at
    # 32 kb/s, for ~70 ms of lag behind the input instead of ~1 s.
    ogg_page_ms: int = 20
    resample_quality: str = "HQ"  # soxr recipe when the output rate differs from the voice's
    # Chunks up to this much audio are encoded on the event loop, longer ones in a thread
    # (pcm and wav, which have no codec, always on the loop).
    inline_encode_max_s: float = 0.1
    # Threads of the encoders' own pool (not asyncio's default pool of up to cores + 4
    # threads): a chunk is a few ms of work at most, and fewer encoder threads leave the
    # cores to the talker and vocoder threads, whose turns the players wait on.
    encoder_threads: int = 1

    def __post_init__(self) -> None:
        check_int_in("mp3_bitrate_bps", self.mp3_bitrate_bps, MP3_BITRATE_RANGE_BPS, "b/s")
        check_int_in("opus_bitrate_bps", self.opus_bitrate_bps, OPUS_BITRATE_RANGE_BPS, "b/s")
        check_int_in("aac_bitrate_bps", self.aac_bitrate_bps, AAC_BITRATE_RANGE_BPS, "b/s")
        check_int_in("ogg_page_ms", self.ogg_page_ms, OGG_PAGE_RANGE_MS, "ms")
        check_choice("resample_quality", self.resample_quality, RESAMPLE_QUALITIES)
        check_number_in(
            "inline_encode_max_s",
            self.inline_encode_max_s,
            (0, MAX_INLINE_ENCODE_S),
            "s",
            note="0: always a worker thread",
        )
        check_int_in("encoder_threads", self.encoder_threads, (1, MAX_ENCODER_THREADS))


DEFAULT_ENCODING = EncodingConfig()
