"""The web demo: a Gradio Blocks app that `create_app` mounts at `/demo` (same process, port and API key).

Upload an image (PNG, JPEG, GeoTIFF; optical or SAR) or pick an example, optionally a second "after" image of the
same place and size (a change question: the two are one conversation, before then after), ask, and the answer
streams into a multi-turn chat; beside it the image with the tool results drawn (`geopilot.visualize`), the plan and tool trace,
and for a georeferenced image a map (folium) of the results over the image footprint. Requests go through the
server's batcher, so the demo shares its limits and its queue with the HTTP API.

Two events run a turn: the Ask button's (streams into the chat; private) and `/ask`, the scriptable one
(`gradio_client`: inputs image, question and an optional after image, outputs answer, drawn image and trace; a
follow-up with no image continues the conversation of that client's session).
"""

import asyncio
import html
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from geopilot.errors import GeoPilotInputError
from geopilot.generation import GenerationOptions
from geopilot.serving.batcher import Batcher, Busy, Job
from geopilot.serving.config import ServeConfig
from geopilot.serving.security import ServeError

UPLOAD_TYPES = [".png", ".jpg", ".jpeg", ".tif", ".tiff"]
OUTCOME_LINES = {  # raw outcomes said the way a user reads them
    "context_limit": "The conversation is longer than the model can read: press Clear and ask again.",
    "round_limit": "The model kept asking for more tools than this server allows; the answer may be incomplete.",
    "unparsable": "The model's plan could not be read, so no tool ran; the answer is its raw text.",
    "deadline": "The request ran out of time before the answer was finished.",
}


@dataclass
class Conversation:
    """One browser tab's (or one gradio_client session's) conversation."""

    image_path: str | None = None
    loaded: Any = None  # the LoadedImage every turn is asked about
    after_path: str | None = None
    after: Any = None  # the optional second (after) image, the same size: then the turns are about the pair
    history: list = field(default_factory=list)  # sample-format messages: the model's view of the conversation
    chat: list[dict] = field(default_factory=list)  # role/content messages: the chat's view
    before_last: tuple[list, list] | None = None  # (history, chat) before the last turn: what Regenerate returns to

    def cleared(self) -> "Conversation":
        """The same image(s), no turns: what Clear starts over with."""
        return Conversation(
            image_path=self.image_path, loaded=self.loaded, after_path=self.after_path, after=self.after
        )


@dataclass
class Turn:
    answer: str
    drawn: Any = None  # PIL image with the tool results drawn
    trace: list[dict] = field(default_factory=list)
    geojson: dict | None = None
    note: str = ""  # one friendly line when something went wrong


def friendly(err: BaseException) -> str:
    if isinstance(err, (ServeError, GeoPilotInputError, Busy)):
        return str(err)
    return f"Something went wrong on the server ({type(err).__name__}); it keeps serving, try again."


def image_facts(path: str) -> tuple[dict, tuple[str, ...]]:
    """What `geopilot image info` reports for the file."""
    from geopilot.commands.image import image_info

    return image_info(Path(path))


def describe(report: dict, notes: tuple[str, ...]) -> str:
    bands = ", ".join(str(b) for b in report["bands"])
    lines = [
        f"**{report['width']} x {report['height']} px**, {report['count']} band(s) ({report['dtype']}); "
        f"shown: band(s) {bands} ({report['bands_reason']}); modality: **{report['modality']}** "
        f"(from {report['modality_source']})",
        f"CRS: {report['crs'] or 'none'}" + (f"; GSD {report['gsd_m']} m" if report["gsd_m"] else ""),
    ]
    return "  \n".join(lines + [f"Note: {n}" for n in notes])


def map_html(bounds: list[float], geojson: dict | None) -> str:
    """A folium map of the image footprint and the results, drawn by the Leaflet copy shipped in this package
    (geopilot/serving/leaflet, BSD-2): no CDN and no tile layer, so it works offline."""
    import folium

    west, south, east, north = bounds
    canvas = folium.Map(tiles=None, control_scale=True)
    canvas.default_js, canvas.default_css = [], []  # folium's CDN links; the local Leaflet is inlined below
    footprint = folium.Rectangle([[south, west], [north, east]], color="#2563eb", fill=False, tooltip="footprint")
    footprint.add_to(canvas)
    if geojson and geojson["features"]:
        folium.GeoJson(geojson, name="tool results").add_to(canvas)
    canvas.fit_bounds([[south, west], [north, east]])
    leaflet = resources.files("geopilot.serving").joinpath("leaflet")
    inline = (
        f"<style>{leaflet.joinpath('leaflet.css').read_text(encoding='utf-8')}</style>"
        f"<script>{leaflet.joinpath('leaflet.js').read_text(encoding='utf-8')}</script>"
    )
    page = canvas.get_root().render().replace("<head>", "<head>" + inline, 1)
    return f'<iframe title="map" srcdoc="{html.escape(page)}" style="width:100%;height:420px;border:0"></iframe>'


def no_map_reason(report: dict | None, notes: tuple[str, ...]) -> str | None:
    if report is None:
        return "no image yet"
    if report["crs"] is None:
        return "this image has no CRS, so it cannot be placed on a map (results are in pixels only)"
    if report["bounds_wgs84"] is None:
        return next((n for n in notes if "CRS" in n), "its CRS cannot be converted to longitude and latitude")
    return None


class DemoRunner:
    """Runs the demo's turns through the server's batcher, under the server's limits."""

    def __init__(self, pilot, config: ServeConfig, batcher: Batcher):
        self.pilot, self.config, self.batcher = pilot, config, batcher
        self.running: dict[str, Job] = {}  # the job each tab (Gradio session) runs now: what Stop cancels

    def stop(self, session: str) -> None:
        if (job := self.running.get(session)) is not None:
            self.batcher.cancel(job)

    def open_image(self, path: str):
        """The upload checked with the API's limits (body size, pixels) and loaded."""
        from geopilot.serving.chat_request import load_request_image

        size = Path(path).stat().st_size
        if size > self.config.max_body_bytes:
            raise ServeError(
                413, f"the file has {size:,} bytes, over this server's limit of {self.config.max_body_bytes:,}"
            )
        return load_request_image(Path(path).read_bytes(), self.config.max_image_pixels)

    def options(self, temperature: float, max_tokens: int) -> GenerationOptions:
        from geopilot.serving.chat_request import MIN_TEMPERATURE

        sample = temperature >= MIN_TEMPERATURE
        return GenerationOptions(
            max_new_tokens=max(1, min(int(max_tokens), self.config.max_new_tokens)),
            do_sample=sample,
            temperature=temperature if sample else 1.0,
        )

    async def turn(
        self,
        state: Conversation,
        question: str,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        session: str = "",
    ) -> AsyncIterator[str | Turn]:
        """Yields the answer as it is decoded (the text so far), then the finished Turn (and updates `state`)."""
        from geopilot.serving.jobs import admit, geojson_of, job_error

        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        end = object()
        images = state.loaded if state.after is None else [state.loaded, state.after]
        request = {"image": images, "query": question, "history": state.history or None, "modality": None}
        job = Job(request, self.options(temperature, max_tokens or self.config.max_new_tokens), self.config.max_rounds)
        job.slot = admit(self.batcher)
        job.on_text = lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece)
        self.running[session] = job
        self.batcher.submit(job)
        job.future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, end))
        text = ""
        try:
            deadline = loop.time() + self.config.request_timeout_s
            while (item := await asyncio.wait_for(pieces.get(), max(0.0, deadline - loop.time()))) is not end:
                text += item
                yield text
            if job.cancelled.is_set():
                raise ServeError(499, "Stopped: the answer was not finished, and the question is not kept.")
            if job.future.exception() is not None:
                raise job_error(job.future.exception())
            result = job.future.result()
        except TimeoutError:
            raise ServeError(504, f"the request took longer than {self.config.request_timeout_s:g} s") from None
        finally:
            self.running.pop(session, None)
            if not job.future.done():  # stopped, timed out or the tab left: free the slot, stop decoding
                self.batcher.cancel(job)
        yield await asyncio.to_thread(self._finish, state, question, result, geojson_of(result))

    def _finish(self, state: Conversation, question: str, result, geojson: dict | None) -> Turn:
        from geopilot.visualize import draw_outputs

        outputs = [c.output for c in result.tool_calls if c.output is not None]
        trace = [
            {
                "round": c.round,
                "tool": c.tool,
                "parameters": c.params,
                "seconds": round(c.seconds, 3),
                "provenance": c.output.provenance if c.output else None,
                "error": c.error,
            }
            for c in result.tool_calls
        ]
        this_turn = result.messages[len(state.history) :]  # the history comes back first
        plans = [m.reasoning for m in this_turn if getattr(m, "role", "") == "assistant" and m.reasoning]
        if plans:
            trace.insert(0, {"plan": plans[0]})
        note = OUTCOME_LINES.get(result.outcome, "") or (
            "Every tool call failed; the answer is the model's own." if result.error else ""
        )
        state.before_last = (list(state.history), list(state.chat))
        state.history = list(result.messages)
        state.chat = [
            *state.chat,
            {"role": "user", "content": question},
            {"role": "assistant", "content": result.answer},
        ]
        return Turn(result.answer, draw_outputs(state.loaded.image, outputs), trace, geojson, note)


def tools_status(pilot, line: str | None) -> str:
    names = pilot.tools.names() if getattr(pilot, "tools", None) is not None else []
    return line or ("Tools: " + (", ".join(names) or "none"))


def example_images(folder: Path | None) -> list[str]:
    if folder is None or not folder.is_dir():
        return []
    return sorted(str(p) for p in folder.iterdir() if p.suffix.lower() in UPLOAD_TYPES)


def _layout(gr, pilot, config: ServeConfig, tools_line: str | None, examples) -> SimpleNamespace:
    """The demo's components, placed inside the open Blocks (the events are wired by `build_demo`)."""
    state = gr.State(None)
    gr.Markdown(
        f"# GeoPilot\nModel **{html.escape(config.model_name)}**. {html.escape(tools_status(pilot, tools_line))}"
    )
    with gr.Row():
        with gr.Column(scale=1):
            image = gr.File(
                label="Image (PNG, JPEG, GeoTIFF)", file_types=UPLOAD_TYPES, type="filepath", elem_id="upload"
            )
            after = gr.File(
                label="After image (optional: the same place later, same size)",
                file_types=UPLOAD_TYPES,
                type="filepath",
                elem_id="upload-after",
            )
            if examples:
                gr.Examples(examples=[[p] for p in examples], inputs=[image], label="Example images")
            info = gr.Markdown(elem_id="image-info")
            with gr.Accordion("Settings", open=False):
                temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0: greedy)")
                max_tokens = gr.Slider(
                    1,
                    max(2, config.max_new_tokens),  # a slider needs two ends; the server's limit still applies
                    value=config.max_new_tokens,
                    step=1,
                    label="Max tokens per turn",
                )
        with gr.Column(scale=2):
            chatbot = gr.Chatbot(label="Conversation", elem_id="chat", height=420)
            status = gr.Markdown(elem_id="status")
            question = gr.Textbox(label="Question", placeholder="How many planes are there?", elem_id="question")
            with gr.Row():
                ask_button = gr.Button("Ask", variant="primary", elem_id="ask")
                stop_button = gr.Button("Stop", elem_id="stop")
                again_button = gr.Button("Regenerate", elem_id="regenerate")
                clear_button = gr.Button("Clear", elem_id="clear")
        with gr.Column(scale=2):
            with gr.Tabs():
                with gr.Tab("Tool results"):
                    drawn = gr.Image(label="Tool results drawn", type="pil", elem_id="drawn", interactive=False)
                with gr.Tab("Map", visible=False) as map_tab:
                    map_view = gr.HTML(elem_id="map")
            with gr.Accordion("Plan and tool trace", open=False):
                trace = gr.JSON(label="trace", elem_id="trace")
    return SimpleNamespace(
        state=state,
        image=image,
        after=after,
        info=info,
        temperature=temperature,
        max_tokens=max_tokens,
        chatbot=chatbot,
        status=status,
        question=question,
        ask_button=ask_button,
        stop_button=stop_button,
        again_button=again_button,
        clear_button=clear_button,
        drawn=drawn,
        map_tab=map_tab,
        map_view=map_view,
        trace=trace,
    )


def build_demo(pilot, config: ServeConfig, batcher: Batcher, tools_line: str | None = None, examples=None):
    """The Blocks app (not launched: `create_app` mounts it)."""
    import gradio as gr

    runner = DemoRunner(pilot, config, batcher)

    def start(state: Conversation | None, path: str | None, after_path: str | None = None) -> Conversation:
        """The tab's conversation, restarted on a new image (or a new after image); raises ServeError for a bad
        upload, GeoPilotInputError for an after image of another size."""
        from geopilot.image import check_same_size

        state, after_path = state or Conversation(), after_path or None
        if path and (path != state.image_path or after_path != state.after_path):
            loaded = runner.open_image(path)
            after = runner.open_image(after_path) if after_path else None
            if after is not None:
                check_same_size([loaded, after])
            state = Conversation(image_path=path, loaded=loaded, after_path=after_path, after=after)
        if state.loaded is None:
            raise ServeError(400, "Upload an image or pick an example first.")
        return state

    def uploaded(path: str | None, after_path: str | None = None):
        """A new image: its facts (as `geopilot image info` says them), the map tab, a fresh conversation."""
        if not path:
            return Conversation(), [], "", gr.Tab(visible=False), "", None, []
        try:
            report, notes = image_facts(path)
            state = start(None, path, after_path)
        except (ServeError, GeoPilotInputError) as err:
            return (
                Conversation(),
                [{"role": "assistant", "content": friendly(err)}],
                "",
                gr.Tab(visible=False),
                "",
                None,
                [],
            )
        reason = no_map_reason(report, notes)
        info = describe(report, notes) + (f"  \nNo map: {reason}." if reason else "")
        shown = None if reason else map_html(report["bounds_wgs84"], None)
        return state, [], info, gr.Tab(visible=reason is None), shown or "", state.loaded.image, []

    async def chat(path, question, state, temperature, max_tokens, after, request: gr.Request, regenerate=False):
        idle = gr.Button(interactive=True)
        if (request.session_hash or "") in runner.running:  # never two at once from one tab
            yield (
                state,
                gr.skip(),
                *(gr.skip(),) * 3,
                "Wait for the answer (or press Stop) first.",
                gr.skip(),
                gr.skip(),
            )
            return
        if regenerate and state is not None and state.before_last is not None:
            question = state.chat[-2]["content"]
            state.history, state.chat = (list(x) for x in state.before_last)
            state.before_last = None
        if not (question or "").strip():
            yield state, (state.chat if state else []), gr.skip(), gr.skip(), gr.skip(), "Type a question.", idle, ""
            return
        try:
            state = start(state, path, after)
        except (ServeError, GeoPilotInputError) as err:
            shown = [*(state.chat if state else []), {"role": "assistant", "content": friendly(err)}]
            yield state, shown, gr.skip(), gr.skip(), gr.skip(), friendly(err), idle, question
            return
        asked = [*state.chat, {"role": "user", "content": question}]
        busy = gr.Button(interactive=False)
        yield state, asked, gr.skip(), gr.skip(), gr.skip(), "Thinking...", busy, ""
        try:
            async for item in runner.turn(state, question, temperature, max_tokens, request.session_hash or ""):
                if isinstance(item, str):
                    yield state, [*asked, {"role": "assistant", "content": item}], *(gr.skip(),) * 3, "", busy, ""
                else:
                    facts, notes = image_facts(state.image_path)
                    bounds = None if no_map_reason(facts, notes) else facts["bounds_wgs84"]
                    drawn_map = map_html(bounds, item.geojson) if bounds else gr.skip()
                    yield state, state.chat, item.drawn, item.trace, drawn_map, item.note, idle, ""
        except (ServeError, GeoPilotInputError, Busy) as err:
            yield (
                state,
                [*asked, {"role": "assistant", "content": friendly(err)}],
                *(gr.skip(),) * 3,
                friendly(err),
                idle,
                "",
            )

    async def ask(image, question, state, after=None):
        """`/ask`: (answer, drawn image, trace); with no image it continues the session's conversation; `after`: an
        optional second image of the same size (image is then the before)."""
        try:
            state = start(state, image, after)
            if not (question or "").strip():
                raise ServeError(400, "Type a question.")
            turn = None
            async for item in runner.turn(state, question):
                turn = item
        except (ServeError, GeoPilotInputError, Busy) as err:
            raise gr.Error(friendly(err)) from None
        return turn.answer, turn.drawn, turn.trace, state

    async def regenerate(path, state, temperature, max_tokens, after, request: gr.Request):
        async for update in chat(path, "", state, temperature, max_tokens, after, request, regenerate=True):
            yield update

    def stop(request: gr.Request):
        runner.stop(request.session_hash or "")

    with gr.Blocks(title=f"GeoPilot: {config.model_name}") as demo:
        ui = _layout(gr, pilot, config, tools_line, examples)
        answer = gr.Textbox(visible=False)
        ui_outputs = [ui.state, ui.chatbot, ui.drawn, ui.trace, ui.map_view, ui.status, ui.ask_button, ui.question]
        gr.on(
            [ui.ask_button.click, ui.question.submit],
            chat,
            [ui.image, ui.question, ui.state, ui.temperature, ui.max_tokens, ui.after],
            ui_outputs,
            api_visibility="private",
            trigger_mode="once",  # never two at once from one tab
        )
        ui.again_button.click(
            regenerate,
            [ui.image, ui.state, ui.temperature, ui.max_tokens, ui.after],
            ui_outputs,
            api_visibility="private",
        )
        ui.stop_button.click(stop, None, None, api_visibility="private", queue=False)
        ui.clear_button.click(
            lambda s: (s.cleared() if s else None, [], None, None, ""),
            ui.state,
            [ui.state, ui.chatbot, ui.drawn, ui.trace, ui.status],
            api_visibility="private",
        )
        gr.on(
            [ui.image.change, ui.after.change],
            uploaded,
            [ui.image, ui.after],
            [ui.state, ui.chatbot, ui.info, ui.map_tab, ui.map_view, ui.drawn, ui.trace],
            api_visibility="private",
        )
        hidden = gr.Button(visible=False)
        hidden.click(
            ask, [ui.image, ui.question, ui.state, ui.after], [answer, ui.drawn, ui.trace, ui.state], api_name="ask"
        )
    return demo
