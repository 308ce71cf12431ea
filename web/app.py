"""The Flask app factory. Served by gunicorn from the Procfile: ``web.app:create_app()``."""

from __future__ import annotations

from flask import Flask, jsonify

from jobs.connection import connect


def create_app(test_config: dict | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_mapping(REDIS_URL=None)
    if test_config:
        app.config.update(test_config)
    app.extensions["leash_redis"] = connect(app.config["REDIS_URL"])

    @app.get("/healthz")
    def healthz():
        try:
            app.extensions["leash_redis"].ping()
        except Exception as exc:  # any Redis failure means "not healthy", never a 500
            return jsonify(ok=False, error=f"redis unreachable: {exc}"), 503
        return jsonify(ok=True)

    return app
