"""The AWS Lambda target's files besides the function runtime: the MXNet backend's container image
(``Dockerfile``) and the Serverless Framework plugin that uploads bundle files too large for a package
(``flatpack_bundle_upload.js``). A package so they ship with flatpack."""
