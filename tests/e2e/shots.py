"""What every screenshot script in tests/e2e shares: a headless Chromium page that waits as long as
a busy host needs, and the two ways a picture is taken — a section of the page from a heading down,
or the page's top — each saved as a PNG of at most 300 KB (a palette PNG, shrunk further if need be)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import Image
from playwright.sync_api import Locator, Page, expect, sync_playwright

from tests.e2e.conftest import CHROMIUM

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "screenshots"
MAX_BYTES = 300 * 1024
WIDTH = 1500


@contextmanager
def chromium_page(height: int = 2400, width: int = WIDTH) -> Iterator[Page]:
    """A page ``width`` × ``height`` whose waits (and ``expect``'s) last two minutes."""
    OUT.mkdir(parents=True, exist_ok=True)
    expect.set_options(timeout=120_000)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": width, "height": height})
        page.set_default_timeout(120_000)
        try:
            yield page
        finally:
            browser.close()


def _small(path: Path) -> None:
    """Rewrite ``path`` as a palette PNG, shrunk by 15 % steps until it is at most MAX_BYTES."""
    image = Image.open(path).convert("RGB")
    scale = 1.0
    while True:
        size = (int(image.width * scale), int(image.height * scale))
        shown = image.resize(size, Image.Resampling.LANCZOS) if scale < 1 else image
        shown.quantize(colors=256).save(path, optimize=True)
        if path.stat().st_size <= MAX_BYTES or scale < 0.5:
            break
        scale *= 0.85
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size / 1024:.0f} KB, {size[0]}×{size[1]})")
    if path.stat().st_size > MAX_BYTES:
        raise SystemExit(f"{path.name} stays over 300 KB")


def top(page: Page, path: Path, height: int | None = None) -> None:
    """The page's top ``height`` pixels (the viewport when None); never a page showing an exception."""
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    viewport = page.viewport_size or {"width": WIDTH, "height": 1000}
    page.screenshot(path=str(path), clip={"x": 0, "y": 0, "width": viewport["width"],
                                          "height": height or viewport["height"]})
    _small(path)


def section(page: Page, text: str, path: Path, height: int, above: int = 60, exact: bool = False) -> None:
    """From the first element showing ``text`` (less ``above`` pixels) down ``height`` pixels.
    Streamlit scrolls its own container, not the page: the element is scrolled to the top first."""
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    element = page.get_by_text(text, exact=exact).first
    element.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(1500)
    box = element.bounding_box()
    assert box is not None, text
    viewport = page.viewport_size or {"width": WIDTH, "height": 2400}
    y = max(0, box["y"] - above)
    page.screenshot(path=str(path), clip={"x": 0, "y": y, "width": viewport["width"],
                                          "height": min(height, viewport["height"] - y)})
    _small(path)


def diagnose_with_cap(page: Page, url: str, recording: Path, cap: int) -> Locator:
    """The Diagnose page on ``recording`` with ``cap`` typed into the sidebar's --max-num-seqs box (as an
    operator who knows the server's flag does); the box, to set back to 0 after."""
    page.goto(url + "/Diagnose")
    expect(page.get_by_text("Knob table").first).to_be_visible()
    box = page.get_by_role("spinbutton", name="--max-num-seqs (to draw the cap)")
    box.fill(str(cap))
    box.press("Enter")
    page.wait_for_timeout(1500)
    page.get_by_text("a recording", exact=True).first.click()
    page.locator('input[type="file"]').set_input_files(str(recording))
    return box
