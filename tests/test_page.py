"""The page at / driven in headless Chromium (Debian's chromium through playwright's Python
API; `make install` apt-installs it when missing): speak, stop, type as you go, and read
the readouts back from the DOM. The page is loaded from http://127.0.0.1 (a secure
context, which AudioWorklet needs); the server runs the sim backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import LiveServer, live_server, sim_settings

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("PLAYHEAD_CHROMIUM", "/usr/bin/chromium")
# No sound card is needed: without one, headless Chromium still runs the audio graph
# (measured: the worklet's played count advances in real time).
ARGS = ["--no-sandbox", "--autoplay-policy=no-user-gesture-required"]
SENTENCE = "Hello from the browser. This sentence is spoken through the worklet."
LONG = "A long answer keeps on talking so that there is something to stop. " * 8


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


@pytest.fixture
def page(server: LiveServer, browser: object) -> Iterator[tuple[object, list[str]]]:
    page = browser.new_page(viewport={"width": 1100, "height": 900})  # type: ignore[attr-defined]
    page.set_default_timeout(15_000)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(f"{server.base_url}/")
    page.wait_for_function("document.querySelector('#voice').value === 'sim'")
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
