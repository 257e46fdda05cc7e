//! The Prometheus endpoint of a component process: `GET /metrics` over HTTP/1.1 on its metrics
//! address, in the text exposition format (see `chainify_node::metrics` for what is in it).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::debug;

/// Renders the metrics text when scraped.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

fn answer(request: &Request<Incoming>, render: &Render) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut response = reply(StatusCode::OK, render());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        (&Method::GET, _) => reply(
            StatusCode::NOT_FOUND,
            "chainify serves its metrics at /metrics\n".into(),
        ),
        _ => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET /metrics is served here\n".into(),
        ),
    }
}

/// Serves `render` at `/metrics` on `listener` until `shutdown` completes.
pub async fn serve_metrics(
    listener: TcpListener,
    render: Render,
    shutdown: impl Future<Output = ()> + Send,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    debug!(error = %e, "metrics: accept failed");
                    continue;
                }
            },
        };
        let render = render.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let response = answer(&request, &render);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(%peer, error = %e, "metrics: connection ended with an error");
            }
        });
    }
}
