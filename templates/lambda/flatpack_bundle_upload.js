'use strict';
// Serverless Framework v3 plugin of a rendered flatpack Lambda service (flatpack deploy MODEL --target lambda
// --dry-run -o DIR): during `serverless deploy` it uploads the bundle files that are too large for the
// function packages to the deployment's bucket, where the functions fetch them at cold start
// (FLATPACK_BUNDLE_S3_URI); during `serverless remove` it empties the deployment's prefixes so the stack's
// bucket can go. The keys, files and bucket are the ones the boto3 deployer uses
// (serving/deploy/aws_lambda.py), read from flatpack-service.json ("s3_bundle") beside this file.
//
// When: before the stack update if the bucket already exists (a redeploy: the new bundle's prefix is its
// own digest, so running versions keep theirs), else right after the update created it (a first deploy:
// nothing runs yet). A file already there with the same sha256 (object metadata) is not sent again.
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

const SERVICE_FILE = 'flatpack-service.json';

function sha256File(file) {
  return new Promise((resolve, reject) => {
    const hash = crypto.createHash('sha256');
    fs.createReadStream(file).on('error', reject).on('data', (chunk) => hash.update(chunk))
      .on('end', () => resolve(hash.digest('hex')));
  });
}

class FlatpackBundleUpload {
  constructor(serverless, options, utils) {
    this.serverless = serverless;
    this.provider = serverless.getProvider('aws');
    this.log = (utils && utils.log) || { notice: console.log, warning: console.warn }; // eslint-disable-line no-console
    const doc = JSON.parse(fs.readFileSync(path.join(__dirname, SERVICE_FILE), 'utf8'));
    this.bundle = doc.s3_bundle;
    this.uploaded = false;
    this.hooks = {
      'before:aws:deploy:deploy:updateStack': () => this.upload(false),
      'after:aws:deploy:deploy:updateStack': () => this.upload(true),
      'before:remove:remove': () => this.empty(),
    };
  }

  async bucket() {
    if (this.bundle.bucket) return this.bundle.bucket;
    let res;
    try {
      res = await this.provider.request('CloudFormation', 'describeStacks', {
        StackName: this.provider.naming.getStackName(),
      });
    } catch (e) {
      if (/does not exist/.test(String(e.message))) return null;
      throw e;
    }
    const outputs = (res.Stacks && res.Stacks[0] && res.Stacks[0].Outputs) || [];
    const out = outputs.find((o) => o.OutputKey === this.bundle.bucket_output);
    return out ? out.OutputValue : null;
  }

  async stored(bucket, key) {
    try {
      const head = await this.provider.request('S3', 'headObject', { Bucket: bucket, Key: key });
      return (head.Metadata && head.Metadata.sha256) || null;
    } catch (e) {
      if (e.code === 'NotFound' || e.code === 'NoSuchKey' || e.statusCode === 404) return null;
      throw e;
    }
  }

  async upload(required) {
    if (!this.bundle || this.uploaded) return;
    const bucket = await this.bucket();
    if (!bucket) {
      if (required) throw new Error(`flatpack: no bucket for the bundle files (stack output ${this.bundle.bucket_output})`);
      return;
    }
    let sent = 0;
    for (const rel of this.bundle.files) {
      const file = path.join(__dirname, 'bundle', rel);
      const sha256 = await sha256File(file);
      const key = `${this.bundle.prefix}/${rel}`;
      if ((await this.stored(bucket, key)) === sha256) continue;
      await this.provider.request('S3', 'upload', {
        Bucket: bucket, Key: key, Body: fs.createReadStream(file), Metadata: { sha256 },
      });
      sent += 1;
    }
    this.uploaded = true;
    this.log.notice(`flatpack: ${sent} of ${this.bundle.files.length} bundle files uploaded to s3://${bucket}/${this.bundle.prefix}/`);
  }

  async empty() {
    if (!this.bundle) return;
    const bucket = await this.bucket();
    if (!bucket) return;
    for (const prefix of this.bundle.remove_prefixes) {
      let token;
      do {
        const page = await this.provider.request('S3', 'listObjectsV2', {
          Bucket: bucket, Prefix: prefix, ContinuationToken: token,
        });
        const keys = (page.Contents || []).map((o) => ({ Key: o.Key }));
        if (keys.length) {
          await this.provider.request('S3', 'deleteObjects', { Bucket: bucket, Delete: { Objects: keys, Quiet: true } });
        }
        token = page.IsTruncated ? page.NextContinuationToken : undefined;
      } while (token);
    }
  }
}

module.exports = FlatpackBundleUpload;
