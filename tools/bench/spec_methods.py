"""Shared by the A/B bench scripts here: the repository root, the embedded model set, and
the `dsinfer generate` arguments of each speculation method they compare."""
import os

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
EMB = os.path.join(REPO, "models", "embedded")
METHODS = {
    "none": [],
    "dflash": ["--spec", "dflash", "--draft-model-path", os.path.join(EMB, "dflash")],
    "dspark-fixed": ["--spec", "dspark", "--spec-schedule", "fixed", "--draft-model-path", os.path.join(EMB, "dspark")],
    "dspark": ["--spec", "dspark", "--draft-model-path", os.path.join(EMB, "dspark")],
    # The drafter alone: the lookup assist (on by default with a drafter) off.
    "dspark-alone": ["--spec", "dspark", "--spec-lookup", "off", "--draft-model-path", os.path.join(EMB, "dspark")],
}
