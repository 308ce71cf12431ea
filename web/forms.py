"""The submission form: a kind, its labels (classify), template (prompt) or JSON Schema
(extract: pasted, or uploaded as a file; static/form.js lists its fields), and items typed
one per line or uploaded as a .txt (one per line) or .csv (a "text" or "item" column if the
header names one, else the column with the most text; csv.Sniffer finds the delimiter and
whether there is a header). flask-wtf adds and checks the CSRF token."""

from __future__ import annotations

import math
import secrets

from flask_wtf import FlaskForm
from flask_wtf.file import FileAllowed, FileField
from wtforms import BooleanField, DecimalField, HiddenField, IntegerField, SelectField, StringField, TextAreaField
from wtforms.fields import SelectChoice
from wtforms.validators import NumberRange, Optional, Regexp

from jobs import kinds
from jobs.intake import files


class UsdField(DecimalField):
    """A decimal box that takes finite numbers only: Decimal reads "sNaN", "NaN", "Infinity" and
    "1e999999" (finite, but infinite as a float), which no budget is (and a signaling NaN raises
    when NumberRange compares it)."""

    def process_formdata(self, valuelist):
        super().process_formdata(valuelist)
        if self.data is not None and not (self.data.is_finite() and math.isfinite(float(self.data))):
            self.data = None
            raise ValueError("a USD budget is a number above 0")


class BaseSubmitForm(FlaskForm):
    """What every job has; each kind's own fields are added by ``submit_form()``."""

    kind = SelectField("Kind", choices=[])
    name = StringField("Name (optional)", description="To find the job again in your list, e.g. March reviews")
    items = TextAreaField("Items", description="One per line")
    items_file = FileField("…or upload a file", validators=[
        FileAllowed(["txt", "csv"], "upload a .txt (one item per line) or .csv file")])
    mode = SelectField("Mode", default="direct", choices=[
        SelectChoice("direct", "Direct: each item is one model call, now"),
        SelectChoice("batch", "Batch: through the provider's batch API, half the price, within 24 h")])
    budget_tokens = IntegerField("Tokens", validators=[
        Optional(), NumberRange(min=1, message="a token budget is a whole number of at least 1")])
    budget_usd = UsdField("USD", places=None, validators=[
        Optional(), NumberRange(min=0.000001, message="a USD budget is a number above 0")])
    no_cache = BooleanField("Ask the model again for every item",
                            description="Skip the request cache: requests already answered are paid for again")
    # A fresh random key per rendered form: submitting the same form twice (double click,
    # back button) returns the first job instead of creating a second.
    submission = HiddenField(validators=[Regexp(r"^[A-Za-z0-9_-]{8,64}$", message="reload the page and submit again")])

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kind.choices = [(name, name) for name in sorted(kinds.KINDS)]
        if not self.submission.data:
            self.submission.data = secrets.token_urlsafe(16)
        if not self.is_submitted():
            self.kind.data = self.chosen_kind()  # ?kind=extract preselects it

    def chosen_kind(self) -> str:
        """The kind whose fields the form shows: the one submitted, else ``?kind=`` (the kind
        links work without JavaScript), else the first."""
        from flask import request

        for wanted in (self.kind.data if self.is_submitted() else None, request.args.get("kind")):
            if wanted in kinds.KINDS:
                return wanted
        return "classify" if "classify" in kinds.KINDS else sorted(kinds.KINDS)[0]

    def shows(self, kind_names: list[str]) -> bool:
        """Whether a field taken by ``kind_names`` is shown for the chosen kind (every field
        is, for a kind that declares none: it reads whatever is filled)."""
        chosen = kinds.KINDS.get(self.chosen_kind())
        return chosen is None or not chosen.fields or chosen.name in kind_names

    def budget(self) -> dict | None:
        """The payload's ``budget``, or None when neither figure is given."""
        budget = {"tokens": self.budget_tokens.data,
                  "usd": float(self.budget_usd.data) if self.budget_usd.data is not None else None}
        return {k: v for k, v in budget.items() if v is not None} or None

    def kind_fields(self) -> list[tuple[kinds.Field, list[str]]]:
        """The kinds' declared fields in this form, with the kinds that take each."""
        return kinds.fields()

    def payload_fields(self) -> dict:
        """The selected kind's declared fields, read from their boxes (an empty box too: the
        kind's check says what is missing). A box left filled from another kind is dropped; a
        kind that declares no fields (its own validator) gets every filled box."""
        chosen = kinds.KINDS.get(self.kind.data)
        declared = {f.name for f in chosen.fields} if chosen else set()
        values = {}
        for field, _ in kinds.fields():
            text = (self[field.name].data or "").strip()
            upload = self[field.name + "_file"].data if field.from_file else None
            if upload and getattr(upload, "filename", ""):  # an uploaded file wins over the box
                text = upload.read().decode("utf-8-sig", errors="replace").strip()
            value = field.from_text(text)
            if (field.name in declared or (text and not declared)) and value is not None:
                values[field.name] = value  # None: an optional box left empty (the default applies)
        return values

    def item_list(self) -> list[str] | None:
        """The items from the upload if there is one, else from the text box; None (with an
        error on the field) when the upload cannot be read."""
        upload = self.items_file.data
        if upload and getattr(upload, "filename", ""):
            try:  # the one reader `leash submit FILE` uses too
                return files.read_items(upload.read(), upload.filename)
            except files.FileProblem as problem:
                self.items_file.errors.append(str(problem))
                return None
        return files.lines(self.items.data or "")


def submit_form(*args, **kwargs) -> BaseSubmitForm:
    """The submission form, with a box for every field a kind declares (jobs.kinds.Field)."""
    boxes = {field.name: (TextAreaField if field.multiline else StringField)(field.label, description=field.help)
             for field, _ in kinds.fields()}
    for field, _ in kinds.fields():  # a field whose option takes a file (a schema) may be uploaded too
        if field.from_file:
            boxes[field.name + "_file"] = FileField(f"…or upload the {field.label.lower()}")
    return type("SubmitForm", (BaseSubmitForm,), boxes)(*args, **kwargs)
