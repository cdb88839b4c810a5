//! The console's only static files, served from the binary: no asset from anywhere else.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
const ICON: &str = include_str!("assets/favicon.svg");

pub(crate) async fn serve(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "console.css" => ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response(),
        "console.js" => ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], JS).into_response(),
        "favicon.svg" => ([(header::CONTENT_TYPE, "image/svg+xml")], ICON).into_response(),
        _ => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}
