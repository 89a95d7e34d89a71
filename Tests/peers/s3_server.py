#!/usr/bin/env python3
"""An S3 server for tests: moto with real SigV4 checking, set up with its own IAM user.

  s3_server.py --port P --bucket NAME --credentials FILE --log FILE [--fail-part N]

moto checks signatures after INITIAL_NO_AUTH_ACTION_COUNT calls; the first four create an IAM
user, its access key, a policy and the attachment. The bucket is then made with that key, and
the key is written to FILE as JSON. Every request is logged (method, path, query, length).
"""
import argparse, json, os, threading, time

os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_CA_BUNDLE", None)

import boto3
from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

POLICY = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bucket", default="backhaul-test")
    parser.add_argument("--credentials", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fail-part", type=int, default=0, help="answer 503 to the Nth UploadPart")
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    parts = {"count": 0}

    def logged(environ, start_response):
        if environ["REQUEST_METHOD"] == "PUT" and "partNumber=" in environ.get("QUERY_STRING", ""):
            parts["count"] += 1
            if parts["count"] == args.fail_part:
                environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                with open(args.log, "a") as log:
                    log.write(json.dumps({"method": "PUT", "path": environ.get("PATH_INFO"), "query": environ.get("QUERY_STRING"),
                                          "content_length": int(environ.get("CONTENT_LENGTH") or 0), "injected": 503}) + "\n")
                start_response("503 Service Unavailable", [("Content-Length", "0")])
                return [b""]
        if environ.get("HTTP_HOST", "").startswith("127.0.0.1"):
            with open(args.log, "a") as log:
                log.write(json.dumps({
                    "method": environ["REQUEST_METHOD"], "path": environ.get("PATH_INFO"),
                    "query": environ.get("QUERY_STRING"), "content_length": int(environ.get("CONTENT_LENGTH") or 0),
                }) + "\n")
        return app(environ, start_response)

    server = make_server("127.0.0.1", args.port, logged, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{args.port}"
    iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="setup", aws_secret_access_key="setup")
    iam.create_user(UserName="backhaul")
    key = iam.create_access_key(UserName="backhaul")["AccessKey"]
    arn = iam.create_policy(PolicyName="all", PolicyDocument=POLICY)["Policy"]["Arn"]
    iam.attach_user_policy(UserName="backhaul", PolicyArn=arn)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    s3.create_bucket(Bucket=args.bucket)
    with open(args.credentials + ".tmp", "w") as out:
        json.dump({"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"], "region": "us-east-1",
                   "bucket": args.bucket, "endpoint": endpoint}, out)
    os.rename(args.credentials + ".tmp", args.credentials)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
