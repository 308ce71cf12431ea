"""leash's Flask front end (``create_app`` in ``web.app``)."""
