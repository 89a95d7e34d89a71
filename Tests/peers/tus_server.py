#!/usr/bin/env python3
"""A tus 1.0.0 server for tests: the PyPI `tuspyserver` router under uvicorn, with a middleware
that logs every request (method, path, Upload-Offset, Content-Length) as one JSON line.

  tus_server.py --port P --files DIR --log FILE
"""
import argparse, json

import uvicorn
from fastapi import FastAPI, Request
from tuspyserver import create_tus_router


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--files", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    app = FastAPI()
    app.include_router(create_tus_router(prefix="files", files_dir=args.files))

    @app.middleware("http")
    async def record(request: Request, call_next):
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
