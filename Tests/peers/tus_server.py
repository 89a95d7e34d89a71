#!/usr/bin/env python3
"""A tus 1.0.0 server for tests: the PyPI `tuspyserver` router under uvicorn, with a middleware
that logs every request (method, path, Upload-Offset, Content-Length) as one JSON line.

  tus_server.py --port P --files DIR --log FILE [--fail-patch N]

--fail-patch N answers 503 to the Nth PATCH (1-based) without storing it.
"""
import argparse, json

import uvicorn
from fastapi import FastAPI, Request, Response
from tuspyserver import create_tus_router


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--files", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fail-patch", type=int, default=0)
    args = parser.parse_args()
    patches = {"count": 0}
    app = FastAPI()
    app.include_router(create_tus_router(prefix="files", files_dir=args.files))

    @app.middleware("http")
    async def record(request: Request, call_next):
        if request.method == "PATCH":
            patches["count"] += 1
        if request.method == "PATCH" and patches["count"] == args.fail_patch:
            await request.body()
            response = Response(status_code=503)
        else:
            response = await call_next(request)
        with open(args.log, "a") as log:
            log.write(json.dumps({
                "method": request.method, "path": request.url.path, "status": response.status_code,
                "upload_offset": request.headers.get("upload-offset"),
                "content_length": int(request.headers.get("content-length") or 0),
            }) + "\n")
        return response

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
