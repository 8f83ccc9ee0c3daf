"""Query wording for the template backend: a small grammar per ability, so no two requests need share a frame.

A request is built from parts: a request verb phrase ("put boxes around {targets}"), a question ("how many
{targets} are there{place}?") or a need ("I need {thing}{place}."), optionally led by a purpose clause ("For a site
survey, ...") and wrapped in a greeting and a sign-off. A model trained on these sees the same intent in hundreds
of frames, so it learns the words that carry the intent (count, box, outline, mask, extent, roads, clouds) and the
class words, not a sentence it memorised. Slots: {targets} (plural class words), {expression}, {classes},
{modality}; {place} is filled here.
"""

from __future__ import annotations

import random

PLACES = [
    "",
    "",
    "",
    " in this image",
    " in this picture",
    " in this scene",
    " on this tile",
    " here",
    " in this {modality} image",
    " in the frame",
    " in this shot",
    " across this area",
    " within this view",
    " in this {modality} scene",
    " on the image",
    " in this photo",
    " in the image",
]

PURPOSES = [
    "For a site survey, ",
    "For my report, ",
    "We are mapping this district, so ",
    "Before the field visit, ",
    "For a change-detection study, ",
    "I'm preparing a briefing; ",
    "For an insurance claim, ",
    "As part of an audit, ",
    "For the planning department, ",
    "For a research paper, ",
    "To update our base map, ",
    "My supervisor needs this: ",
    "For a disaster-response team, ",
    "For the monthly monitoring bulletin, ",
    "To check a contractor's claim, ",
    "For a student project, ",
    "Ahead of tomorrow's meeting, ",
    "For our GIS layer, ",
    "To validate another model, ",
    "For a quick sanity check, ",
    "Since the archive labels are missing, ",
    "For a logistics study, ",
]

# Eight blanks in each list: about a quarter of requests come with no greeting, and about as many with no sign-off.
OPENINGS = [""] * 8 + [
    "Hello there. ",
    "Good morning! ",
    "Could you help me out? ",
    "I have a request. ",
    "Hey there! ",
    "Question for you. ",
    "I'm working on a survey. ",
    "This is for a project. ",
    "Here is a tile from last week. ",
    "My manager asked for this. ",
    "Another one for you. ",
    "Hey! ",
    "Good afternoon. ",
    "Sorry to bother you. ",
    "Quick one. ",
    "Okay, next image. ",
    "Right. ",
    "Hi there. ",
    "Greetings. ",
    "New task. ",
    "Can you do something for me? ",
    "A small favour. ",
    "Morning! ",
    "Hope you're well. ",
]
CLOSINGS = [""] * 8 + [
    " Thank you!",
    " Thanks a lot.",
    " Please be concise.",
    " Much appreciated.",
    " No rush.",
    " Many thanks.",
    " It's for a report.",
    " Take your time.",
    " I need it today.",
    " Thanks in advance.",
    " Short answer, please.",
    " Appreciated.",
    " Thank you kindly.",
    " Best regards.",
    " Cheers!",
    " That would help a lot.",
    " Ta.",
    " Be brief.",
    " Thanks so much.",
    " Grateful for the help.",
    " Ping me when done.",
    " Thx.",
]

# ability -> (request verb phrases, questions, things a user may say they need). Questions end with "?".
GRAMMAR: dict[str, tuple[list[str], list[str], list[str]]] = {
    "object_detection": (
        [
            "detect the {targets}",
            "find all the {targets}",
            "locate every one of the {targets}",
            "put boxes around the {targets}",
            "draw bounding boxes around the {targets}",
            "box each of the {targets}",
            "mark the {targets} with rectangles",
            "highlight the {targets}",
            "spot the {targets}",
            "identify the {targets}",
            "pick out the {targets}",
            "pinpoint the {targets}",
            "count the {targets}",
            "tally the {targets}",
            "enumerate the {targets}",
            "look for {targets}",
            "search for any {targets}",
            "give me the locations of the {targets}",
            "list the positions of the {targets}",
            "show me where the {targets} are",
            "run the object detector on the {targets}",
            "count and box the {targets}",
            "mark out all {targets}",
            "find and count the {targets}",
            "point out the {targets}",
        ],
        [
            "how many {targets} are there{place}?",
            "how many {targets} can you find{place}?",
            "where are the {targets}{place}?",
            "are there any {targets}{place}?",
            "can you find the {targets}{place}?",
            "what is the number of {targets}{place}?",
            "could you box the {targets}{place}?",
            "do you see any {targets}{place}? Where are they?",
            "where exactly are the {targets} located{place}?",
            "how many {targets} does this contain, and where?",
            "what is the count of {targets}{place}?",
            "can you tell me how many {targets} there are?",
            "which positions do the {targets} occupy{place}?",
            "could you mark where the {targets} are?",
            "are {targets} to be seen{place}? If yes, where?",
        ],
        [
            "a count of the {targets}",
            "the number of {targets}",
            "boxes for the {targets}",
            "bounding boxes for all of the {targets}",
            "the locations of the {targets}",
            "a headcount of the {targets}",
            "the coordinates of every one of the {targets}",
            "a list of the {targets} with their boxes",
            "the position of each of the {targets}",
            "each of the {targets} boxed",
        ],
    ),
    "instance_segmentation": (
        [
            "segment each of the {targets}",
            "outline every one of the {targets} on their own",
            "mask each of the {targets} individually",
            "give the {targets} one mask apiece",
            "delineate each of the {targets} on its own",
            "split the {targets} into single-object masks",
            "trace the outline of each of the {targets}",
            "extract instance masks of the {targets}",
            "cut each of the {targets} out on its own",
            "produce per-object masks for the {targets}",
            "apply instance segmentation to the {targets}",
            "draw the exact shape of every one of the {targets}",
            "measure the footprint of each of the {targets}",
            "outline the {targets} individually",
            "make one mask per object for the {targets}",
        ],
        [
            "what area does each of the {targets} cover{place}?",
            "how big are the {targets}, one by one?",
            "which of the {targets} is the largest? Outline each of them.",
            "what are the footprints of the {targets}?",
            "how much ground does each of the {targets} occupy{place}?",
            "can you outline the {targets} individually?",
            "how large is each one of the {targets}?",
            "could you give me a mask per {targets} instance?",
            "what does each of the {targets} cover, object by object?",
        ],
        [
            "individual masks of the {targets}",
            "the footprint of each of the {targets}",
            "the area of every one of the {targets}",
            "instance masks for the {targets}",
            "a separate outline per object for the {targets}",
            "the size of each of the {targets}, one by one",
        ],
    ),
    "semantic_segmentation": (
        [
            "segment the {classes}",
            "map the {classes}",
            "map out the {classes} areas",
            "classify the {classes} pixels",
            "label the {classes} pixels",
            "label all pixels of {classes}",
            "delineate the {classes}",
            "produce a land-cover layer of {classes}",
            "colour in the {classes}",
            "make a per-class map for {classes}",
            "show how far the {classes} extends",
            "apply semantic segmentation to the {classes}",
            "mask the {classes} areas",
            "measure the {classes} coverage",
            "quantify the {classes}",
            "work out how much {classes} there is",
            "give me a pixel-level map of {classes}",
            "shade the {classes} regions",
        ],
        [
            "how much of this area is {classes}?",
            "what percentage of this image is {classes}?",
            "what share of this tile is {classes}?",
            "what fraction of this scene is {classes}?",
            "what proportion of this area is covered by {classes}?",
            "where is the {classes}{place}?",
            "how large is the {classes} area{place}?",
            "is {classes} the main cover type? Measure it.",
            "how much {classes} is there{place}?",
            "which parts are {classes}{place}?",
            "how is {classes} distributed{place}?",
            "does {classes} cover more than half of the tile?",
        ],
        [
            "the share covered by {classes}",
            "a land-cover mask of {classes}",
            "the extent covered by {classes}",
            "a pixel-level map of {classes}",
            "the area covered by {classes}",
            "a segmentation map of {classes}",
            "the percentage of {classes}",
        ],
    ),
    "visual_grounding": (
        [
            "locate {expression}",
            "find {expression}",
            "put a box on {expression}",
            "draw a box around {expression}",
            "give me the box of {expression}",
            "return the bounding box of {expression}",
            "mark {expression}",
            "point to {expression}",
            "show where {expression} is",
            "pinpoint {expression}",
            "highlight {expression}",
            "localise {expression}",
            "localize {expression}",
            "spot {expression}",
            "detect {expression}",
            "put a rectangle around {expression}",
            "find the position of {expression}",
        ],
        [
            "where is {expression}?",
            "can you find {expression}?",
            "which part of the image contains {expression}?",
            "what are the coordinates of {expression}?",
            "in what part of the tile can {expression} be found?",
            "could you show me {expression}?",
            "where would I find {expression}?",
            "where exactly is {expression} located?",
            "can you box {expression}?",
        ],
        [
            "the box around {expression}",
            "the whereabouts of {expression}",
            "the coordinates of {expression}",
            "the bounding box for {expression}",
            "the position of {expression}",
        ],
    ),
    "referring_segmentation": (
        [
            "segment {expression}",
            "mask {expression}",
            "give me a mask of {expression}",
            "outline {expression}",
            "extract {expression} as a mask",
            "produce a binary mask for {expression}",
            "isolate {expression}",
            "cut out {expression}",
            "trace the boundary of {expression}",
            "delineate {expression}",
            "draw the exact outline of {expression}",
            "extract the shape of {expression}",
            "measure the footprint of {expression}",
            "fill in the pixels of {expression}",
        ],
        [
            "which pixels belong to {expression}?",
            "what area does {expression} cover?",
            "how big is {expression}?",
            "how much room does {expression} use?",
            "what is the exact shape of {expression}?",
            "which area does {expression} fill?",
            "how large is the footprint of {expression}?",
            "can you mask {expression}?",
            "what is the outline of {expression}?",
        ],
        [
            "the mask of {expression}",
            "the exact outline of {expression}",
            "a pixel mask for {expression}",
            "the footprint of {expression}",
            "the shape of {expression}",
            "the area of {expression}",
        ],
    ),
    "road_extraction": (
        [
            "extract the roads",
            "extract the road network",
            "map every street",
            "trace the roads",
            "trace the centre lines of the roads",
            "vectorise the road network",
            "digitise every street",
            "pull out the road graph",
            "give me the roads in graph form",
            "draw the street network",
            "build the road graph",
            "map the road network",
            "outline the roads",
            "follow the streets and map them",
            "analyse the road layout",
            "check the road connectivity",
        ],
        [
            "how many intersections are there{place}?",
            "how many junctions are on the road network?",
            "how many crossings are there between the streets?",
            "are the roads all connected?",
            "how are the roads laid out{place}?",
            "what does the street layout look like?",
            "how long are the roads{place}?",
            "which roads meet each other?",
            "how well connected are the streets?",
            "does this area have decent road access?",
            "could a vehicle drive from one side to the other?",
            "what does the road network look like{place}?",
            "how dense are the streets{place}?",
        ],
        [
            "the road network as a graph",
            "a street graph",
            "the street layout",
            "the centre lines of the roads",
            "the junctions of the road network",
            "the road connectivity",
            "a map of the roads",
        ],
    ),
    "cloud_removal": (
        [
            "remove the clouds",
            "get the clouds out of the way",
            "strip the clouds off",
            "clear the cloud cover",
            "take the clouds away",
            "dehaze the image",
            "erase the haze",
            "apply cloud removal",
            "restore the ground under the clouds",
            "make this scene cloud-free",
            "produce a cloudless copy",
            "clean the clouds out of this image",
            "lift the cloud layer",
            "fix the cloudy image",
        ],
        [
            "what is under the clouds{place}?",
            "what does the ground look like beneath the clouds?",
            "can you see through the haze?",
            "can I get a cloud-free version?",
            "what would this look like without the clouds?",
            "could you clear the clouds away?",
            "what is hidden by the cloud cover?",
            "can you restore the surface under the haze?",
        ],
        [
            "a cloud-free version",
            "a clear-sky image",
            "the surface under the clouds",
            "a dehazed copy",
            "a cloudless view",
            "the image without the clouds",
        ],
    ),
    "panoptic_detection": (
        [
            "detect each object",
            "detect all objects, whatever their class",
            "box all objects",
            "find everything and box it",
            "list every object with its box",
            "run a full detection",
            "catalogue the objects",
            "inventory the objects",
            "detect targets of every category",
            "label every object",
            "identify all the objects and where they are",
            "box every target",
            "find objects of every class",
            "survey all the objects",
            "detect whatever objects there are",
        ],
        [
            "what objects are there{place}, and where?",
            "what kinds of objects does this contain, and where?",
            "which objects appear{place}?",
            "what targets can you detect{place}?",
            "which object classes are present, and where?",
            "what objects can you box{place}?",
            "can you list all the objects with their boxes?",
            "what sorts of targets are there and where do they sit?",
        ],
        [
            "a list of every object with its box",
            "an inventory of all the objects",
            "every object boxed",
            "all the targets and their positions",
            "a full object register",
            "all detections of any class",
        ],
    ),
}
GRAMMAR["visual_grounding_sar"] = GRAMMAR["visual_grounding"]

# Two images, before and after: what changed, how many buildings came or went, what share of the area changed, and
# a description of the change (tool-free). Their {place} names the pair, never one image.
PAIR_PLACES = [
    "",
    "",
    "",
    " between these two images",
    " between the two dates",
    " from the first image to the second",
    " between the before and after shots",
    " over this period",
    " since the earlier acquisition",
    " between these acquisitions",
    " in this pair",
    " across the two scenes",
    " between the two {modality} images",
    " from before to after",
    " between the older and the newer tile",
]
CHANGE_GRAMMAR: dict[str, tuple[list[str], list[str], list[str]]] = {
    "change_what": (
        [
            "show me what changed",
            "find the changes",
            "mark every change",
            "locate the changed areas",
            "outline the areas that changed",
            "point out the differences",
            "compare the two images and box the changes",
            "detect the changes",
            "map the changes",
            "highlight the regions that are different",
        ],
        [
            "what changed{place}?",
            "what is different{place}?",
            "where did things change{place}?",
            "which areas are not the same{place}?",
            "has anything changed{place}, and where?",
            "what has been built or demolished{place}?",
            "where are the differences{place}?",
        ],
        [
            "a map of the changes",
            "the changed regions with their boxes",
            "every difference, located",
            "the locations of all changes",
            "a change mask",
            "a list of what changed and where",
        ],
    ),
    "change_count": (
        [
            "count the new buildings",
            "count the buildings that appeared or disappeared",
            "tally the changed buildings",
            "count the building changes",
            "find and count the new constructions",
            "count how many buildings are new or gone",
            "enumerate the buildings that changed",
        ],
        [
            "how many new buildings are there{place}?",
            "how many buildings changed{place}?",
            "how many buildings were built or torn down{place}?",
            "what number of buildings appeared{place}?",
            "how many constructions are new{place}?",
            "how many building changes can you find{place}?",
        ],
        [
            "the number of new buildings",
            "a count of the changed buildings",
            "how many buildings appeared or vanished",
            "a tally of the building changes",
        ],
    ),
    "change_share": (
        [
            "measure how much of the area changed",
            "estimate the changed fraction of the area",
            "work out the share of the ground that changed",
            "quantify the change",
            "give the percentage of changed pixels",
            "compute how much of the scene is different",
        ],
        [
            "what share of the area changed{place}?",
            "what fraction of the scene is different{place}?",
            "how much of the ground changed{place}?",
            "what percentage of the area was altered{place}?",
            "how large is the changed part of the scene{place}?",
            "how much of this area is not as it was{place}?",
        ],
        [
            "the changed fraction of the area",
            "the percentage of the scene that changed",
            "the share of changed ground",
            "a figure for how much changed",
        ],
    ),
    "change_caption": (
        [
            "describe the change",
            "describe what changed",
            "summarise the differences",
            "write a sentence about what changed",
            "caption the change",
            "tell me in words what is different",
            "explain how the scene changed",
        ],
        [
            "how did this area change{place}?",
            "what happened{place}?",
            "can you describe the change{place}?",
            "what is the main difference{place}?",
            "how would you sum up the change{place}?",
            "in one sentence, what changed{place}?",
        ],
        [
            "a one-sentence description of the change",
            "a caption of the change",
            "a short summary of what changed",
            "a description of the differences",
        ],
    ),
}
GRAMMAR.update(CHANGE_GRAMMAR)

NEEDS = [
    "I need {thing}{place}.",
    "I'd like {thing}{place}.",
    "Please give me {thing}{place}.",
    "Can I get {thing}{place}?",
    "Send me {thing}{place}.",
    "I want {thing}{place}.",
    "I'm after {thing}{place}.",
    "Could you provide {thing}{place}?",
    "What I need is {thing}{place}.",
]
POLITE = [
    "",
    "",
    "",
    "please ",
    "kindly ",
    "could you ",
    "can you ",
    "would you ",
    "I'd like you to ",
    "help me ",
    "go ahead and ",
    "I need you to ",
]


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def compose(ability: str, difficulty: str, rng: random.Random) -> str:
    """One request for `ability` with its slots still open, e.g. "Hey! For my report, count the {targets} here."

    Easy requests are bare verbs or needs, medium ones questions, hard ones carry a purpose clause."""
    verbs, questions, needs = GRAMMAR[ability]
    place = rng.choice(_places(ability))
    form = rng.choice(
        ["verb", "verb", "question", "need"]
        if difficulty == "easy"
        else ["verb", "question", "question", "need"]
        if difficulty == "medium"
        else ["verb", "question", "need"]
    )
    if form == "verb":
        polite = rng.choice(POLITE)
        end = "?" if polite.rstrip().endswith("you") else "."  # "could you ...?", but "I need you to ..."
        body = polite + rng.choice(verbs) + place + end
    elif form == "question":
        body = rng.choice(questions).replace("{place}", place)
    else:
        body = rng.choice(NEEDS).replace("{thing}", rng.choice(needs)).replace("{place}", place)
    if difficulty == "hard" or rng.random() < 0.15:
        return rng.choice(PURPOSES) + (body if body.startswith(("I ", "I'")) else body[:1].lower() + body[1:])
    return sentence(body)


def wrap(query: str, rng: random.Random) -> str:
    """A greeting before and a sign-off after, often none."""
    return rng.choice(OPENINGS) + sentence(query) + rng.choice(CLOSINGS)


def _places(ability: str) -> list[str]:
    return PAIR_PLACES if ability in CHANGE_GRAMMAR else PLACES


def frames(ability: str) -> list[str]:
    """Every request body `compose` can write for `ability` (no greeting, sign-off or purpose), slots open."""
    verbs, questions, needs = GRAMMAR[ability]
    places = _places(ability)
    out = [p + v + place + e for p in POLITE for v in verbs for place in places for e in (".", "?")]
    out += [q.replace("{place}", place) for q in questions for place in places]
    out += [n.replace("{thing}", t).replace("{place}", place) for n in NEEDS for t in needs for place in places]
    return list(dict.fromkeys(sentence(f) for f in out))
