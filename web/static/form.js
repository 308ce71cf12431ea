// The submission form: a JSON Schema box (extract) shows the fields each answer will have, as
// it is typed or pasted; a schema file chosen for upload is read into the box. Without
// JavaScript the upload still works (the server reads it) and the job page shows the fields.
"use strict";

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
