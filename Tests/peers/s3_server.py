#!/usr/bin/env python3
"""An S3 server for tests: moto with real SigV4 checking, set up with its own IAM user.

  s3_server.py --port P --bucket NAME --credentials FILE --log FILE [--fail-part N] [--corrupt-part N]

moto checks signatures after INITIAL_NO_AUTH_ACTION_COUNT calls; the first four create an IAM
user, its access key, a policy and the attachment. The bucket is then made with that key, and
the key is written to FILE as JSON. Every request is logged (method, path, query, length; for
STS's AssumeRoleWithWebIdentity, the token it carried). STS takes AssumeRoleWithWebIdentity
unsigned; moto wants every call signed once it checks, so such a call is signed here with the
user's key before moto sees it.

moto stores `x-amz-checksum-sha256` without checking it; this wrapper checks it the way S3 does
(400 BadDigest when the body does not match), so a test can see a damaged part refused.
--corrupt-part N flips one byte of the Nth UploadPart body on its way in, as a bad link would.
--numeric-etags writes the quotes of ListParts' ETags as numeric character references, as some
S3 servers do: `&#34;` for the first and `&#x22;` for the second, so both forms are read.

moto does not check presigned URLs (it wants an Authorization header). A request whose query
carries X-Amz-Signature is checked here the way S3 checks a SigV4 presigned URL (the canonical
request over the query without the signature, the signed headers and UNSIGNED-PAYLOAD; 403
SignatureDoesNotMatch, or AccessDenied "Request has expired" past X-Amz-Expires), then handed
to moto without the X-Amz-* parameters and signed in the Authorization header with the same key.
"""
import argparse, base64, hashlib, hmac, io, json, os, re, threading, time, urllib.parse
from datetime import datetime, timezone

os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_CA_BUNDLE", None)

import boto3
from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

def quote(text):
    return urllib.parse.quote(text, safe="-_.~")


def presigned_refusal(environ, key):
    """Why the presigned request in environ does not hold (None when it does)."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ["PATH_INFO"]
    path, _, query = raw.partition("?")
    pairs = [tuple(urllib.parse.unquote(p) for p in (item.split("=", 1) + [""])[:2]) for item in query.split("&") if item]
    params = dict(pairs)
    credential = params.get("X-Amz-Credential", "").split("/")
    if params.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" or len(credential) != 5 or credential[0] != key["access_key_id"]:
        return "SignatureDoesNotMatch", "bad credential"
    signed_at = datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()
    canonical_query = "&".join(f"{quote(k)}={quote(v)}" for k, v in sorted(pairs) if k != "X-Amz-Signature")
    names = params["X-Amz-SignedHeaders"].split(";")
    headers = {"host": environ.get("HTTP_HOST", "")}
    for name in names:
        if name != "host":
            headers[name] = environ.get("HTTP_" + name.upper().replace("-", "_"), "")
    canonical = "\n".join([environ["REQUEST_METHOD"], path, canonical_query,
                           "".join(f"{n}:{headers[n].strip()}\n" for n in names), ";".join(names), "UNSIGNED-PAYLOAD"])
    scope = "/".join(credential[1:])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", params["X-Amz-Date"], scope, hashlib.sha256(canonical.encode()).hexdigest()])
    signing = ("AWS4" + key["secret_access_key"]).encode()
    for part in credential[1:]:
        signing = hmac.new(signing, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(signing, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, params.get("X-Amz-Signature", "")):
        return "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided."
    if signed_at + int(params.get("X-Amz-Expires", "0")) < time.time():
        return "AccessDenied", "Request has expired"
    return None


def resign_for_moto(environ, key):
    """The presigned request as moto wants it: the X-Amz-* parameters out, SigV4 in the headers."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ["PATH_INFO"]
    path, _, query = raw.partition("?")
    kept = "&".join(item for item in query.split("&") if item and not item.startswith("X-Amz-"))
    environ["QUERY_STRING"] = kept
    environ["RAW_URI"] = environ["REQUEST_URI"] = path + ("?" + kept if kept else "")
    host = environ.get("HTTP_HOST", "")
    request = AWSRequest(method=environ["REQUEST_METHOD"], url=f"http://{host}{environ['RAW_URI']}",
                         headers={"host": host, "x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
    S3SigV4Auth(Credentials(key["access_key_id"], key["secret_access_key"]), "s3", key["region"]).add_auth(request)
    environ["HTTP_AUTHORIZATION"] = request.headers["Authorization"]
    environ["HTTP_X_AMZ_DATE"] = request.headers["X-Amz-Date"]
    environ["HTTP_X_AMZ_CONTENT_SHA256"] = request.headers["X-Amz-Content-SHA256"]


def sign_for_moto(environ, body, key):
    """An unsigned STS call (AssumeRoleWithWebIdentity, which STS takes unsigned) as moto wants
    it once it checks signatures: signed in the Authorization header with the user's key."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    host = environ.get("HTTP_HOST", "")
    request = AWSRequest(method="POST", url=f"http://{host}{environ.get('PATH_INFO') or '/'}", data=body,
                         headers={"host": host, "content-type": environ.get("CONTENT_TYPE", "")})
    SigV4Auth(Credentials(key["access_key_id"], key["secret_access_key"]), "sts", key["region"]).add_auth(request)
    environ["HTTP_AUTHORIZATION"] = request.headers["Authorization"]
    environ["HTTP_X_AMZ_DATE"] = request.headers["X-Amz-Date"]


POLICY = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bucket", default="backhaul-test")
    parser.add_argument("--credentials", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fail-part", type=int, default=0, help="answer 503 to the Nth UploadPart")
    parser.add_argument("--corrupt-part", type=int, default=0, help="damage the body of the Nth UploadPart")
    parser.add_argument("--numeric-etags", action="store_true", help="ListParts writes ETag quotes as &#34; and &#x22;")
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    parts = {"count": 0}
    presign_key = {}

    def logged(environ, start_response):
        if "X-Amz-Signature=" in environ.get("QUERY_STRING", "") and presign_key:
            refusal = presigned_refusal(environ, presign_key)
            entry = {"method": environ["REQUEST_METHOD"], "path": environ.get("PATH_INFO"), "presigned": True,
                     "refused": refusal and refusal[0]}
            with open(args.log, "a") as log:
                log.write(json.dumps(entry) + "\n")
            if refusal:
                environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                document = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{refusal[0]}</Code>"
                            f"<Message>{refusal[1]}</Message></Error>").encode()
                start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(document)))])
                return [document]
            resign_for_moto(environ, presign_key)
        entry = {"method": environ["REQUEST_METHOD"], "path": environ.get("PATH_INFO"), "query": environ.get("QUERY_STRING"),
                 "content_length": int(environ.get("CONTENT_LENGTH") or 0), "checksum": environ.get("HTTP_X_AMZ_CHECKSUM_SHA256")}
        is_part = environ["REQUEST_METHOD"] == "PUT" and "partNumber=" in environ.get("QUERY_STRING", "")
        if environ["REQUEST_METHOD"] == "PUT":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            if is_part and parts["count"] + 1 == args.corrupt_part and body:
                body = bytes([body[0] ^ 0xFF]) + body[1:]
                entry["corrupted"] = True
            environ["wsgi.input"] = io.BytesIO(body)
            claimed = environ.get("HTTP_X_AMZ_CHECKSUM_SHA256")
            if claimed and base64.b64encode(hashlib.sha256(body).digest()).decode() != claimed:
                entry["injected"] = 400
                with open(args.log, "a") as log:
                    log.write(json.dumps(entry) + "\n")
                if is_part:
                    parts["count"] += 1
                document = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>BadDigest</Code>" \
                           b"<Message>The SHA256 you specified did not match the calculated checksum.</Message></Error>"
                start_response("400 Bad Request", [("Content-Type", "application/xml"), ("Content-Length", str(len(document)))])
                return [document]
        if is_part:
            parts["count"] += 1
            if parts["count"] == args.fail_part:
                environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                entry["injected"] = 503
                with open(args.log, "a") as log:
                    log.write(json.dumps(entry) + "\n")
                start_response("503 Service Unavailable", [("Content-Length", "0")])
                return [b""]
        if environ["REQUEST_METHOD"] == "POST" and environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
            # STS: the web identity token an AssumeRoleWithWebIdentity carried (moto does not check it).
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
            if form.get("Action") == ["AssumeRoleWithWebIdentity"]:
                entry["action"] = "AssumeRoleWithWebIdentity"
                entry["web_identity_token"] = form.get("WebIdentityToken", [""])[0]
                entry["role_session_name"] = form.get("RoleSessionName", [""])[0]
                if "HTTP_AUTHORIZATION" not in environ and presign_key:
                    sign_for_moto(environ, body, presign_key)
        is_list_parts = environ["REQUEST_METHOD"] == "GET" and "uploadId=" in environ.get("QUERY_STRING", "")
        if args.numeric_etags and is_list_parts:
            return numeric_etags(environ, start_response, entry)
        if environ.get("HTTP_HOST", "").startswith("127.0.0.1"):
            with open(args.log, "a") as log:
                log.write(json.dumps(entry) + "\n")
        return app(environ, start_response)

    def numeric_etags(environ, start_response, entry):
        answer = {}

        def keep(status, headers, exc_info=None):
            answer["status"], answer["headers"] = status, headers

        body = b"".join(app(environ, keep))
        rewritten = {"count": 0}

        def etag(match):
            value = match.group(1).replace(b"&quot;", b'"').replace(b"&#34;", b'"')
            rewritten["count"] += 1
            return b"<ETag>" + value.replace(b'"', b"&#34;", 1).replace(b'"', b"&#x22;", 1) + b"</ETag>"

        body = re.sub(rb"<ETag>(.*?)</ETag>", etag, body)
        entry["numeric_etags"] = rewritten["count"]
        with open(args.log, "a") as log:
            log.write(json.dumps(entry) + "\n")
        headers = [(k, v) for k, v in answer["headers"] if k.lower() != "content-length"]
        start_response(answer["status"], headers + [("Content-Length", str(len(body)))])
        return [body]

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
    presign_key.update(access_key_id=key["AccessKeyId"], secret_access_key=key["SecretAccessKey"], region="us-east-1")
    with open(args.credentials + ".tmp", "w") as out:
        json.dump({"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"], "region": "us-east-1",
                   "bucket": args.bucket, "endpoint": endpoint}, out)
    os.rename(args.credentials + ".tmp", args.credentials)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
