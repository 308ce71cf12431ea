// The submission form: choosing a kind shows its fields only (the server renders the chosen
// kind's; without JavaScript the kind links below the choice reload the form for another); a
// JSON Schema box (extract) shows the fields each answer will have, as it is typed or pasted; a
// schema file chosen for upload is read into the box. Without JavaScript the upload still works
// (the server reads it) and the job page shows the schema. A form whose files and boxes add up
// to more than the server's body limit (LEASH_MAX_BODY_BYTES, the form's data-max-body) is not
// sent: the server would refuse it before reading a field, and what was typed would be lost; the
// size and the limit are said beside the upload instead.
"use strict";

function sizeText(bytes) {
  if (bytes >= 1024 * 1024) return (bytes / (1024 * 1024)).toFixed(1) + " MB";
  if (bytes >= 1024) return (bytes / 1024).toFixed(1) + " KB";
  return bytes + " bytes";
}

// Bytes the form's body takes: its files, its text as UTF-8, and each part's headers.
function formBytes(form) {
  var total = 0;
  var files = [];
  Array.prototype.forEach.call(form.elements, function (element) {
    if (!element.name || element.disabled) return;
    total += 200;
    if (element.type === "file") {
      Array.prototype.forEach.call(element.files || [], function (file) {
        total += file.size;
        files.push(file);
      });
    } else if (typeof element.value === "string") {
      total += new Blob([element.value]).size;
    }
  });
  return { bytes: total, files: files };
}

function checkBodySize(form, event) {
  var limit = parseInt(form.getAttribute("data-max-body") || "0", 10);
  var shown = document.getElementById("too-large");
  if (!limit || !shown) return;
  var body = formBytes(form);
  if (body.bytes <= limit) {
    shown.hidden = true;
    return;
  }
  event.preventDefault();
  var names = body.files.map(function (file) { return file.name + " (" + sizeText(file.size) + ")"; });
  shown.textContent = "The form is " + sizeText(body.bytes) + (names.length ? " with " + names.join(", ") : "") +
    "; the limit is " + sizeText(limit) + " (LEASH_MAX_BODY_BYTES). Nothing was sent: upload fewer or shorter " +
    "items, or split the file into several jobs.";
  shown.hidden = false;
  shown.scrollIntoView({ block: "center" });
}

function showKindFields(kind) {
  document.querySelectorAll(".kind-field[data-kinds]").forEach(function (field) {
    var kinds = field.getAttribute("data-kinds").split(" ");
    field.hidden = kinds.indexOf(kind) < 0;
  });
  if (window.history && window.history.replaceState) {
    var url = new URL(window.location.href);
    url.searchParams.set("kind", kind);
    window.history.replaceState(null, "", url.pathname + url.search);
  }
}

function describeSchema(text) {
  if (!text.trim()) return "";
  var schema;
  try {
    schema = JSON.parse(text);
  } catch (e) {
    return "Not JSON yet: " + e.message;
  }
  var props = schema && typeof schema === "object" ? schema.properties : null;
  if (!props || typeof props !== "object" || !Object.keys(props).length) {
    return "No fields yet: the schema needs \"type\": \"object\" and \"properties\".";
  }
  var required = Array.isArray(schema.required) ? schema.required : [];
  var names = Object.keys(props).map(function (name) {
    var type = props[name] && props[name].type;
    var shown = type ? name + " (" + [].concat(type).join(" or ") + ")" : name;
    return required.indexOf(name) >= 0 ? shown : shown + ", optional";
  });
  return "Each answer's fields, a column each in the results: " + names.join("; ");
}

document.addEventListener("DOMContentLoaded", function () {
  var form = document.getElementById("submit-form");
  if (form) {
    form.addEventListener("submit", function (event) { checkBodySize(form, event); });
  }
  var select = document.querySelector("select[data-kind-select]");
  if (select) {
    // A kind that declares no fields of its own reads every box: the server shows them all then.
    var declared = {};
    document.querySelectorAll(".kind-field[data-kinds]").forEach(function (field) {
      field.getAttribute("data-kinds").split(" ").forEach(function (k) { declared[k] = true; });
    });
    select.addEventListener("change", function () {
      if (declared[select.value]) {
        showKindFields(select.value);
      } else {
        document.querySelectorAll(".kind-field").forEach(function (field) { field.hidden = false; });
      }
    });
  }
  document.querySelectorAll("textarea[data-fields]").forEach(function (box) {
    var shown = document.getElementById(box.getAttribute("data-fields"));
    if (!shown) return;
    function show() {
      var text = describeSchema(box.value);
      shown.textContent = text;
      shown.hidden = !text;
    }
    box.addEventListener("input", show);
    document.querySelectorAll("input[type=file][data-fills='" + box.id + "']").forEach(function (upload) {
      upload.addEventListener("change", function () {
        var file = upload.files && upload.files[0];
        if (!file) return;
        file.text().then(function (text) {
          box.value = text;
          show();
        });
      });
    });
    show();
  });
});
