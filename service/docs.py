"""/docs: Swagger UI served by the service itself, so it works with no internet.

FastAPI's default page loads Swagger UI's script and stylesheet from a CDN
(and its favicon from fastapi.tiangolo.com); a server on a closed network
then shows a blank page. The assets come from the swagger-ui-bundle-v2
package (Swagger UI 5.x, which renders OpenAPI 3.1) and are served under
/docs/assets.
"""

from __future__ import annotations

import swagger_ui_bundle  # type: ignore[import-untyped]
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS = "/docs"
ASSETS = "/docs/assets"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"


def add_routes(app: FastAPI) -> None:
    """GET /docs, its assets and the OAuth2 redirect page (create the app with docs_url=None)."""
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="swagger-ui-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(DOCS, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            oauth2_redirect_url=OAUTH2_REDIRECT,
            # the validator badge would ask validator.swagger.io about our schema
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(OAUTH2_REDIRECT, include_in_schema=False)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
