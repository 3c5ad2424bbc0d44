"""The page at / driven in headless Chromium (Debian's chromium through playwright's Python
API; `make install` apt-installs it when missing): speak, stop, type as you go, and read
the readouts back from the DOM. The page is loaded from http://127.0.0.1 (a secure
context, which AudioWorklet needs); the server runs the sim backend (one paced like the
Piper voice's start for the test under an extra CPU load), and the bundled Piper voice for
the slow test of a long answer under that load (skipped on a machine too busy for it).

The stall counter read here is the player's own (the audio worklet counts where its ring
runs dry); the jitter buffer's delay and pre-roll are read from the page's readouts, and
the playback.position acks the page sends are recorded in the page (WebSocket.send)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import LiveServer, live_server, sim_settings

from app.settings import load_settings

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("PLAYHEAD_CHROMIUM", "/usr/bin/chromium")
# No sound card is needed: without one, headless Chromium still runs the audio graph
# (measured: the worklet's played count advances in real time).
ARGS = ["--no-sandbox", "--autoplay-policy=no-user-gesture-required"]
SENTENCE = "Hello from the browser. This sentence is spoken through the worklet."
LONG = "A long answer keeps on talking so that there is something to stop. " * 8
PREROLL_MS = 100  # the page's initial jitter buffer (app/static/app.js)
# About 22 s of the Piper voice.
ANSWER = (
    "Playhead reads this answer aloud while it is still being written. "
    "Each sentence is turned into sound just ahead of the listener, so the voice never waits. "
    "The weather today is mild, with a light breeze from the west and a few clouds in the "
    "afternoon. Tomorrow should be warmer, and the weekend looks dry, which is good news for "
    "the market in the square. If you have questions, ask them at any time, and the answer "
    "will start almost at once."
)
# its first two sentences (~7.5 s, a segment boundary): where the paced voice's chunks come
# just in time (its ramp; after it the voice runs 2.3x real time)
ANSWER_START = ANSWER[: ANSWER.index("never waits.") + len("never waits.")]
# all but its last sentence (~18 s of the Piper voice)
ANSWER_LONG = ANSWER[: ANSWER.index("square.") + len("square.")]
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
# Records what the page sends on its socket: [performance.now(), message] pairs.
RECORD_SENDS = """
window.__sent = [];
const send = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) {
  if (typeof data === "string") window.__sent.push([performance.now(), JSON.parse(data)]);
  return send.call(this, data);
};
"""
# A core kept busy for at most `argv[1]` seconds (the test kills it sooner).
BURN = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end: pass"
)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    # The sim's vocoder at ~8x real time: audio flows like a real voice's, a bit faster.
    with live_server(sim_settings("sim.vocoder_per_frame_ms=10")) as live:
        yield live


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: `apt-get install chromium`"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


def _open_page(browser: object, url: str, voice: str) -> tuple[object, list[str]]:
    page = browser.new_page(viewport={"width": 1100, "height": 900})  # type: ignore[attr-defined]
    page.set_default_timeout(15_000)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.add_init_script(RECORD_SENDS)
    page.goto(url)
    page.wait_for_function(f"document.querySelector('#voice').value === {voice!r}")
    return page, problems


@pytest.fixture
def page(server: LiveServer, browser: object) -> Iterator[tuple[object, list[str]]]:
    page, problems = _open_page(browser, f"{server.base_url}/", "sim")
    yield page, problems
    page.close()


def _value(page: object, element_id: str) -> str:
    return page.get_attribute(f"#{element_id}", "data-value")  # type: ignore[attr-defined]


def _log(page: object) -> str:
    return page.inner_text("#log")  # type: ignore[attr-defined]


def test_speak_plays_and_shows_the_readouts(page: tuple[object, list[str]], tmp_path: Path) -> None:
    page_, problems = page
    page_.fill("#text", SENTENCE)
    page_.click("#speak")
    page_.wait_for_function("Number(document.querySelector('#played').dataset.value) > 1.0")
    page_.wait_for_function("Number(document.querySelector('#acks').dataset.value) >= 3")
    ttfa_ms = float(_value(page_, "ttfa"))
    assert 0 < ttfa_ms < 10_000
    assert page_.inner_text("#ttfa") == f"{int(ttfa_ms)} ms"
    # Time to first audio is its arrival plus the pre-roll, the only latency the player adds:
    # the jitter buffer's initial delay (the first chunk is short: it waits it out in full).
    arrived_ms = float(page_.get_attribute("#ttfa", "data-arrived"))
    preroll_ms = float(page_.get_attribute("#ttfa", "data-preroll"))
    assert ttfa_ms == arrived_ms + preroll_ms
    assert PREROLL_MS - 1 <= preroll_ms <= PREROLL_MS + 10  # a render quantum is 2.9 ms
    assert page_.inner_text("#ttfa-split") == f"{int(arrived_ms)} + {int(preroll_ms)} ms pre-roll"
    assert float(_value(page_, "jitter")) == PREROLL_MS
    assert float(_value(page_, "played")) > 1.0
    assert int(_value(page_, "stalls")) >= 0
    assert float(_value(page_, "buffered")) >= 0
    page_.wait_for_function("document.querySelector('#log').innerText.includes('audio.done #0')")
    assert "audio.start #0" in _log(page_)
    assert page_.inner_text("#connection") == "Connected"
    shot = tmp_path / "page.png"
    page_.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    print(f"\nscreenshot: {shot}; first audio {ttfa_ms:.0f} ms after the text")
    assert problems == []


def test_stop_silences_at_once_and_the_next_utterance_plays(
    page: tuple[object, list[str]],
) -> None:
    page_, problems = page
    page_.fill("#text", LONG)
    page_.click("#speak")
    page_.wait_for_function("Number(document.querySelector('#played').dataset.value) > 0.5")
    page_.click("#stop")
    page_.wait_for_function("document.querySelector('#cancel').dataset.value !== ''")
    page_.wait_for_function("document.querySelector('#log').innerText.includes('cancelled')")
    assert float(_value(page_, "cancel")) >= 0
    assert page_.inner_text("#cancel-server").startswith("server: audio.done in")
    page_.wait_for_function("document.querySelector('#buffered').dataset.value === '0'")
    played_at_stop = float(_value(page_, "played"))
    page_.wait_for_timeout(300)  # it stays silent: nothing more is played
    assert float(_value(page_, "played")) == played_at_stop
    page_.fill("#text", SENTENCE)
    page_.click("#speak")
    page_.wait_for_function("document.querySelector('#log').innerText.includes('audio.done #1')")
    page_.wait_for_function(
        f"Number(document.querySelector('#played').dataset.value) > {played_at_stop + 0.5}"
    )
    assert problems == []


def test_type_as_you_go_speaks_before_the_text_is_finished(
    page: tuple[object, list[str]],
) -> None:
    page_, problems = page
    page_.check("#live")
    assert page_.inner_text("#speak") == "Finish"
    page_.fill("#text", "")
    page_.click("#text")
    page_.keyboard.type("Typing live now, one key at a time. And more", delay=15)
    # The first sentence is spoken while the second is still being typed.
    page_.wait_for_function("document.querySelector('#log').innerText.includes('audio.start #0')")
    assert "audio.done #0" not in _log(page_)
    page_.keyboard.press("Enter")
    page_.wait_for_function("document.querySelector('#log').innerText.includes('audio.done #0')")
    page_.wait_for_function("Number(document.querySelector('#played').dataset.value) > 0.5")
    assert problems == []


def _acks(page: object, utterance: int) -> list[tuple[float, float]]:
    """The page's playback.position acks for `utterance`: (ms since page load, played_ms)."""
    sent = page.evaluate("window.__sent")  # type: ignore[attr-defined]
    return [
        (at_ms, message["played_ms"])
        for at_ms, message in sent
        if message["type"] == "playback.position" and message["utterance"] == utterance
    ]


def _check_acks_are_played_audio(acks: list[tuple[float, float]], silent_ms: float) -> None:
    """Acks say what was played: never more than the time that passed, and behind the wall
    clock by the player's silences (the stalls after the first ack)."""
    assert len(acks) >= 5
    # An ack carries the player's last report (every ~50 ms), which a busy main thread
    # reads late: one ack may be that much staler than the next.
    stale_ms = 250
    for (t0, played0), (t1, played1) in itertools.pairwise(acks):
        assert played1 >= played0
        assert played1 - played0 <= (t1 - t0) + stale_ms, (t0, played0, t1, played1)
    (first_at, first_played), (last_at, last_played) = acks[0], acks[-1]
    assert last_played - first_played <= (last_at - first_at) - silent_ms + stale_ms


def test_a_throttled_connection_stalls_and_the_jitter_buffer_grows(
    page: tuple[object, list[str]],
) -> None:
    """Chromium throttles the page's socket below the audio's byte rate (DevTools' network
    emulation applies to WebSocket frames): the player runs dry, the worklet counts the
    stall, and the jitter buffer grows; the next answer starts with the grown buffer as its
    pre-roll. The acks stay what was played."""
    page_, problems = page
    assert float(_value(page_, "jitter")) == PREROLL_MS
    cdp = page_.context.new_cdp_session(page_)  # type: ignore[attr-defined]
    cdp.send("Network.enable")
    throttle = {"offline": False, "latency": 0, "uploadThroughput": -1}
    # 40 kB/s: under half the s16 PCM byte rate at the AudioContext's 44.1 or 48 kHz
    cdp.send("Network.emulateNetworkConditions", {**throttle, "downloadThroughput": 40_000})
    page_.fill("#text", SENTENCE * 2)
    page_.click("#speak")
    page_.wait_for_function("Number(document.querySelector('#stalls').dataset.value) >= 1")
    cdp.send("Network.emulateNetworkConditions", {**throttle, "downloadThroughput": -1})
    page_.wait_for_function("document.querySelector('#log').innerText.includes('audio.done #0')")
    page_.wait_for_function("document.querySelector('#buffered').dataset.value === '0'")
    stalls = int(_value(page_, "stalls"))
    grown_ms = float(_value(page_, "jitter"))
    assert stalls >= 1
    assert grown_ms >= 1.5 * PREROLL_MS  # a stall grows it by at least half
    assert page_.inner_text("#jitter-why") == "grown after a stall"
    silent_ms = float(page_.inner_text("#stall-time").removesuffix(" ms silent"))
    assert silent_ms > 0
    assert "stall at" in _log(page_)
    _check_acks_are_played_audio(_acks(page_, 0), silent_ms)
    # The next answer waits out the grown buffer before it plays (its audio takes longer
    # than that to arrive), and plays without a stall.
    played_s = float(_value(page_, "played"))
    page_.fill("#text", LONG)
    page_.click("#speak")
    page_.wait_for_function(
        f"Number(document.querySelector('#played').dataset.value) > {played_s + 1.0}"
    )
    preroll_ms = float(page_.get_attribute("#ttfa", "data-preroll"))
    assert grown_ms - 1 <= preroll_ms <= grown_ms + 10
    assert int(_value(page_, "stalls")) == stalls
    page_.click("#stop")
    assert problems == []


@pytest.fixture(scope="module")
def piper_server() -> Iterator[LiveServer]:
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load > cores + 1:
        # Then the voice itself falls behind real time (measured at a load of 10 on 2 cores:
        # chunks seconds late): no player could play it without a gap.
        pytest.skip(f"the machine is too busy to play in real time: load {load:.1f}, {cores} cores")
    settings = load_settings(
        CONFIGS / "default.yaml", ["backend.kind=piper", "server.log_level=warning"], environ={}
    )
    live = LiveServer(settings)
    live.start(timeout_s=60)  # loads the voice and calibrates (a few s; more on a busy machine)
    try:
        yield live
    finally:
        live.stop()


# The sim paced like the Piper voice's start, a little late: 58 ms frames at the page's
# rate (no resampling), a ramp of short chunks (58, 232, 464 ms, then 697 ms), each chunk
# costing 20 ms + 18 ms a frame with a frame of context each side. Measured on a busy
# machine (load 7 on 2 cores): the second chunk arrives 70-93 ms after the first, which
# plays 58 ms, so without a pre-roll the player runs dry; with 100 ms it has 65-90 ms to
# spare. The costs are sleeps: the voice keeps real time (2.3x after the ramp) however
# busy the machine, and what the load delays is the rest (the server's loop and threads,
# the browser, the worklet).
PIPER_PACED = (
    "sim.sample_rate_hz=44100",
    "sim.samples_per_frame=2560",
    "sim.talker_frames_per_step=4",
    "sim.vocoder_base_ms=20",
    "sim.vocoder_per_frame_ms=18",
    "chunking.chunk_frames=12",
    "chunking.ramp=[1,4,8]",
    "chunking.left_context_frames=1",
    "chunking.right_context_frames=1",
)


@pytest.fixture(scope="module")
def paced_server() -> Iterator[LiveServer]:
    with live_server(sim_settings(*PIPER_PACED)) as live:
        yield live


def _play_under_load(
    browser: object, url: str, voice: str, text: str = ANSWER
) -> tuple[object, list[str]]:
    """Speak `text` while another process keeps a core busy; wait until it has played."""
    page, problems = _open_page(browser, url, voice)
    burner = subprocess.Popen([sys.executable, "-c", BURN, "90"])
    try:
        page.fill("#text", text)  # type: ignore[attr-defined]
        started = time.monotonic()
        page.click("#speak")  # type: ignore[attr-defined]
        page.wait_for_function(  # type: ignore[attr-defined]
            "document.querySelector('#log').innerText.includes('audio.done #0')", timeout=60_000
        )
        page.wait_for_function(  # type: ignore[attr-defined]
            "document.querySelector('#buffered').dataset.value === '0'", timeout=60_000
        )
        elapsed_s = time.monotonic() - started
        assert burner.poll() is None  # the load ran throughout
    finally:
        burner.kill()
        burner.wait()
    print(
        f"\n{_value(page, 'played')} s played in {elapsed_s:.1f} s; first audio "
        f"{_value(page, 'ttfa')} ms; closest call {_value(page, 'low-water')} ms; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    return page, problems


def _check_played_without_a_stall(page: object, problems: list[str], min_played_s: float) -> None:
    log = _log(page)
    assert float(_value(page, "played")) > min_played_s
    assert "stall at" not in log, log
    assert int(_value(page, "stalls")) == 0
    assert page.inner_text("#stall-time") == "0 ms silent"  # type: ignore[attr-defined]
    preroll_ms = float(page.get_attribute("#ttfa", "data-preroll"))  # type: ignore[attr-defined]
    assert PREROLL_MS - 1 <= preroll_ms <= PREROLL_MS + 10
    _check_acks_are_played_audio(_acks(page, 0), 0)
    assert problems == []


def test_an_answer_paced_like_the_voice_plays_without_a_stall_under_cpu_load(
    paced_server: LiveServer, browser: object
) -> None:
    """~7.5 s whose first chunks come just in time, while another process keeps a core busy:
    the pre-roll absorbs what the load delays; without it the player runs dry."""
    page, problems = _play_under_load(browser, f"{paced_server.base_url}/", "sim", ANSWER_START)
    _check_played_without_a_stall(page, problems, 6)
    page.close()  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_long_answer_plays_without_a_stall_under_cpu_load(
    piper_server: LiveServer, browser: object
) -> None:
    """~18 s of the Piper voice (four sentences, three segment boundaries) while another
    process keeps a core busy: the jitter buffer's pre-roll absorbs the late chunks, the
    player never runs dry."""
    url, voice = f"{piper_server.base_url}/", "en_US-joe-medium"
    page, problems = _play_under_load(browser, url, voice, ANSWER_LONG)
    _check_played_without_a_stall(page, problems, 15)
    page.close()  # type: ignore[attr-defined]
