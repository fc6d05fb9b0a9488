"""FastAPI routes by resource; each module's ``add_routes(app, state)`` declares its own."""
