"""The Gradio demo driven in headless Chromium (Debian `chromium` + `chromium-driver`, Selenium): sign in with a
`?key=` link, upload an image, ask, see the answer and the drawn detections, follow up, stop a long answer, clear,
add an after image (and one of another size: one line).
A screenshot of each state goes to build/test-artifacts/ (or $GEOPILOT_ARTIFACTS_DIR); docs/images/web_*.png are
copies of them."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
from helpers.serving import KEY, png_bytes, serving
from PIL import Image

from geopilot.serving.api import create_app
from geopilot.serving.config import ServeConfig
from geopilot.serving.web import example_images

pytestmark = pytest.mark.slow  # starts a browser
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")
def test_demo_upload_ask_follow_up_stop_and_clear(scripted_pilot, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    scene = ROOT / "examples" / "images" / "airport.png"
    if not scene.exists():  # an installed copy without the examples folder
        scene = tmp_path / "scene.png"
        scene.write_bytes(png_bytes(320, 240, seed=3))
    width, height = Image.open(scene).size
    georeferenced = None
    if importlib.util.find_spec("rasterio") is not None:
        from helpers.geo_fixtures import write_scene

        georeferenced = write_scene(tmp_path / "utm.tif")
    config = ServeConfig(model_name="geopilot-demo", api_key=KEY)
    app = create_app(scripted_pilot(delay_s=0.3), config, examples=example_images(scene.parent))
    artifacts = Path(os.environ.get("GEOPILOT_ARTIFACTS_DIR", ROOT / "build" / "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1000"):
        options.add_argument(flag)
    with serving(app) as url:
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        wait = WebDriverWait(driver, 60)

        def chat() -> str:
            return driver.find_element(By.ID, "chat").text

        def ask(question: str) -> None:
            box = driver.find_element(By.CSS_SELECTOR, "#question textarea")
            box.clear()
            box.send_keys(question)
            driver.find_element(By.ID, "ask").click()

        def ask_enabled(d) -> bool:
            return d.find_element(By.ID, "ask").is_enabled()

        try:
            driver.get(url + "/demo/")
            assert "needs the API key" in driver.find_element(By.ID, "login-message").text
            driver.find_element(By.ID, "key").send_keys(KEY)
            driver.find_element(By.ID, "login").click()  # the form's ?key= becomes a cookie
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#upload input[type=file]"))
            assert "geopilot-demo" in driver.title
            driver.find_element(By.CSS_SELECTOR, "#upload input[type=file]").send_keys(str(scene))
            wait.until(lambda d: "modality" in d.find_element(By.ID, "image-info").text)
            assert f"{width} x {height}" in driver.find_element(By.ID, "image-info").text
            driver.save_screenshot(str(artifacts / "web_upload.png"))

            ask("TOOL: how many planes are there?")
            wait.until(lambda d: not ask_enabled(d))  # disabled while it runs
            wait.until(lambda d: "There are 2 planes." in chat() and ask_enabled(d))
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#drawn img"))
            assert driver.find_element(By.CSS_SELECTOR, "#drawn img").get_attribute("src")
            driver.find_element(By.XPATH, "//*[normalize-space(text())='Plan and tool trace']").click()
            wait.until(lambda d: "detect_objects" in d.find_element(By.ID, "trace").text)
            driver.save_screenshot(str(artifacts / "web_answer.png"))

            ask("and what else is there?")  # continues the conversation: the history's question gets answered
            wait.until(lambda d: chat().count("There are 2 planes.") == 2 and ask_enabled(d))
            assert "and what else is there?" in chat()
            driver.save_screenshot(str(artifacts / "web_follow_up.png"))

            ask("LONG: describe everything")
            wait.until(lambda d: "LONG: describe everything" in chat() and not ask_enabled(d))
            driver.find_element(By.ID, "stop").click()
            wait.until(ask_enabled)
            driver.save_screenshot(str(artifacts / "web_stopped.png"))
            assert "A direct answer about the scene." not in chat() and "Stopped" in chat()

            driver.find_element(By.ID, "clear").click()
            wait.until(lambda d: "There are 2 planes." not in chat())
            driver.save_screenshot(str(artifacts / "web_cleared.png"))

            after, small = tmp_path / "after.png", tmp_path / "small.png"  # a second date: the pair is one chat
            after.write_bytes(png_bytes(width, height, seed=5))
            small.write_bytes(png_bytes(32, 32, seed=6))
            driver.find_element(By.CSS_SELECTOR, "#upload-after input[type=file]").send_keys(str(after))
            ask("TOOL: how many planes are there now?")
            wait.until(lambda d: "There are 2 planes." in chat() and ask_enabled(d))
            driver.save_screenshot(str(artifacts / "web_after.png"))
            driver.find_element(By.CSS_SELECTOR, "#upload-after button[aria-label='Clear']").click()
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#upload-after input[type=file]"))
            driver.find_element(By.CSS_SELECTOR, "#upload-after input[type=file]").send_keys(str(small))
            wait.until(lambda d: f"image 2 is 32x32 px but image 1 is {width}x{height}" in chat())
            driver.find_element(By.CSS_SELECTOR, "#upload-after button[aria-label='Clear']").click()  # one image again

            if georeferenced is not None:  # a GeoTIFF with a CRS: the Map tab draws the footprint offline
                driver.find_element(By.CSS_SELECTOR, "#upload button[aria-label='Clear']").click()
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#upload input[type=file]"))
                driver.find_element(By.CSS_SELECTOR, "#upload input[type=file]").send_keys(str(georeferenced))
                wait.until(lambda d: "EPSG:32633" in d.find_element(By.ID, "image-info").text)
                tabs = wait.until(
                    lambda d: [
                        t for t in d.find_elements(By.XPATH, "//button[normalize-space()='Map']") if t.is_displayed()
                    ]
                )
                tabs[0].click()
                frame = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#map iframe"))
                driver.switch_to.frame(frame)
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".leaflet-container path"))  # the footprint
                driver.switch_to.default_content()
                driver.save_screenshot(str(artifacts / "web_map.png"))
        finally:
            driver.quit()
