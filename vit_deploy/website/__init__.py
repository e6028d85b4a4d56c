"""`vit-deploy web`: a static site (the JavaScript runtime, a bundle, a page) and its preview server."""
