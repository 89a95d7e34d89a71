#!/usr/bin/env python3
"""Temporary AWS credentials from moto's STS (AssumeRole), for the daemon's credential chain.

  aws_credentials.py --port P --s3 FILE --token T --log FILE [--rotate SECONDS]
      a container credentials endpoint (ECS / EKS Pod Identity form): GET with
      `Authorization: T` answers {"AccessKeyId", "SecretAccessKey", "Token", "Expiration"};
      new credentials every SECONDS, each reported to expire SECONDS after it was issued.
      Each answer is logged as a JSON line (time and the credentials, for a test to grep for).
  aws_credentials.py --process --s3 FILE
      a credential_process: prints {"Version": 1, ...} once (and logs it with --log).
  aws_credentials.py --role --s3 FILE
      prints the ARN of the role `edge` (for web identity: AWS_ROLE_ARN).

FILE is what s3_server.py wrote (its endpoint and the IAM user's keys). The role `edge` is made
on first use, with the user's policy that allows everything.
"""
import argparse, datetime, json, os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ.pop("AWS_CA_BUNDLE", None)
import boto3

TRUST = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]})


def keys_of(config):
    return dict(endpoint_url=config["endpoint"], region_name=config["region"],
                aws_access_key_id=config["access_key_id"], aws_secret_access_key=config["secret_access_key"])


def role_arn(config):
    """The role `edge`, made on first use with the user's policy that allows everything."""
    iam = boto3.client("iam", **keys_of(config))
    try:
        role = iam.create_role(RoleName="edge", AssumeRolePolicyDocument=TRUST)["Role"]["Arn"]
        policy = [p["Arn"] for p in iam.list_policies(Scope="Local")["Policies"] if p["PolicyName"] == "all"][0]
        iam.attach_role_policy(RoleName="edge", PolicyArn=policy)
    except iam.exceptions.EntityAlreadyExistsException:
        role = iam.get_role(RoleName="edge")["Role"]["Arn"]
    return role


def assume(config):
    role = role_arn(config)
    answer = boto3.client("sts", **keys_of(config)).assume_role(RoleArn=role, RoleSessionName="backhaul", DurationSeconds=900)
    return answer["Credentials"]


def iso(moment):
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--s3", required=True)
    parser.add_argument("--token", default="")
    parser.add_argument("--log", default="/dev/null")
    parser.add_argument("--rotate", type=float, default=10)
    parser.add_argument("--process", action="store_true")
    parser.add_argument("--role", action="store_true")
    args = parser.parse_args()
    config = json.load(open(args.s3))
    if args.role:
        print(role_arn(config))
        return
    if args.process:
        c = assume(config)
        with open(args.log, "a") as log:
            log.write(json.dumps({"at": time.time(), "access_key_id": c["AccessKeyId"], "secret": c["SecretAccessKey"],
                                  "token": c["SessionToken"]}) + "\n")
        print(json.dumps({"Version": 1, "AccessKeyId": c["AccessKeyId"], "SecretAccessKey": c["SecretAccessKey"],
                          "SessionToken": c["SessionToken"], "Expiration": iso(c["Expiration"])}))
        return
    state = {"issued": 0.0, "credentials": None}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def do_GET(self):
            if self.headers.get("Authorization") != args.token:
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with lock:
                now = time.time()
                if state["credentials"] is None or now - state["issued"] >= args.rotate:
                    state["credentials"] = assume(config)
                    state["issued"] = now
                c, issued = state["credentials"], state["issued"]
            body = json.dumps({"AccessKeyId": c["AccessKeyId"], "SecretAccessKey": c["SecretAccessKey"], "Token": c["SessionToken"],
                               "Expiration": iso(datetime.datetime.fromtimestamp(issued + args.rotate + 1))}).encode()
            with open(args.log, "a") as log:
                log.write(json.dumps({"at": time.time(), "access_key_id": c["AccessKeyId"], "secret": c["SecretAccessKey"],
                                      "token": c["SessionToken"]}) + "\n")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
