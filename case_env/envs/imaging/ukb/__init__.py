"""UK Biobank downloads: zip names and protocol facts, DICOM, station stitching, ingest, segmentation."""
