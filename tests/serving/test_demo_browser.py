"""The web demo driven in headless Chromium (Debian `chromium` + `chromium-driver`, Selenium): upload an image,
ask, see the answer, the reasoning, the tool calls and the image with the detections drawn. The screenshot is
kept in build/test-artifacts/ (or $GEOPILOT_ARTIFACTS_DIR)."""

from __future__ import annotations

import base64
import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.serving import KEY, png_bytes, serving
from PIL import Image

from geopilot.serving.api import create_app
from geopilot.serving.config import ServeConfig

pytestmark = pytest.mark.slow  # starts a browser
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")
def test_demo_upload_ask_and_see_the_drawn_result(scripted_pilot, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    scene = tmp_path / "scene.png"
    scene.write_bytes(png_bytes(320, 240, seed=3))
    app = create_app(scripted_pilot(delay_s=0.05), ServeConfig(model_name="geopilot-demo", api_key=KEY))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    with serving(app) as url:
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        try:
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {KEY}"}})
            driver.get(url + "/demo")
            assert "geopilot-demo" in driver.find_element(By.ID, "model").text
            driver.find_element(By.ID, "image").send_keys(str(scene))
            driver.find_element(By.ID, "question").send_keys("TOOL: how many planes are there?")
            driver.find_element(By.ID, "send").click()
            WebDriverWait(driver, 60).until(
                lambda d: (
                    d.find_element(By.ID, "status").get_attribute("data-done")
                    or "error" in d.find_element(By.ID, "status").get_attribute("class")
                )
            )
            assert driver.find_element(By.ID, "status").get_attribute("class") != "error"
            assert driver.find_element(By.ID, "answer").text == "There are 2 planes."
            assert "detect_objects" in driver.find_element(By.ID, "tools").text
            assert "Counting needs the detector." in driver.find_element(By.ID, "reasoning").text
            drawn = driver.find_element(By.ID, "drawn").get_attribute("src")
            assert drawn.startswith("data:image/png;base64,")
            shown = np.asarray(Image.open(io.BytesIO(base64.b64decode(drawn.split(",", 1)[1]))).convert("RGB"))
            original = np.asarray(Image.open(scene).convert("RGB"))
            assert shown.shape == original.shape and (shown != original).any(axis=2).mean() > 0.005  # boxes drawn
            artifacts = Path(os.environ.get("GEOPILOT_ARTIFACTS_DIR", ROOT / "build" / "test-artifacts"))
            artifacts.mkdir(parents=True, exist_ok=True)
            assert driver.save_screenshot(str(artifacts / "demo.png"))
        finally:
            driver.quit()
